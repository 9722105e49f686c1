#include "ops/observer/observer_args.h"

#include "ops/common/quant_attrs.h"

namespace qg {

std::shared_ptr<const KernelArgs> parse_observer_args(const ArgsSource& s) {
  auto a = std::make_shared<ObserverArgs>();
  const Attrs& at = s.attrs;
  a->layout = scope_layout(s.op, at, s.inputs.at(0).shape);
  a->cfg = qparams_config_from_attrs(s.op, at);
  a->delayed = at.has("delayed") && at.get_bool("delayed");
  if (at.has("averaging_constant")) a->averaging_constant = at.get_real("averaging_constant");
  if (at.has("bins")) a->bins = at.get_int("bins");
  if (at.has("upsample_rate")) a->upsample_rate = at.get_int("upsample_rate");
  if (s.op == "histogram_observer") a->dst_nbins = int64_t{1} << at.get_int("bits");
  if (at.has("percentile")) a->percentile = at.get_real("percentile");
  a->replicated = at.has("replicated") && at.get_bool("replicated");
  if (at.has("qscheme")) a->symmetric = at.get_string("qscheme") == "symmetric";
  return a;
}

}  // namespace qg

// The installed headers by their path inside the repository, as releases before the
// <qatgraph/...> names documented them: both spellings must keep resolving.
#include "autograd/grad.h"
#include "core/tensor.h"
#include "runtime/executor.h"

bool legacy_header_names_resolve() {
  qg::Graph g;
  qg::ValueId x = g.input("x", {qg::DType::f32, {2}});
  qg::ValueId y = g.apply1("neg", {x});
  qg::Executor ex(g);
  qg::Executor::Feeds feeds;
  feeds["x"] = qg::Tensor::from_vector({2}, std::vector<float>{1.0f, -2.0f});
  std::vector<qg::Tensor> out = ex.run(feeds, {y});
  return out.at(0).data<float>()[0] == -1.0f && out.at(0).data<float>()[1] == 2.0f;
}

#include "runtime/static_run.h"

#include "core/error.h"

namespace qg {

StaticRun::StaticRun(Executor& exec, const Executor::Feeds& feeds,
                     const std::vector<ValueId>& fetches, const std::vector<NodeId>& targets,
                     bool plan_memory, bool validate)
    : exec_(exec), planned_(plan_memory), training_(exec.training()) {
  const Graph& g = exec.graph();
  const Device device = exec.device();
  // One validated run through the executor: it checks every type and feed and creates the
  // states. Its intermediates are released as it goes; only states survive it.
  if (validate) exec.run(feeds, fetches, targets);
  plan_ = qg::plan_memory(g, needed_order(g, fetches, targets), fetches);
  if (planned_) arena_ = Tensor::empty({plan_.arena_bytes}, DType::u8, device);
  scratch_ = std::make_unique<ScratchPool>(device);

  values_.assign(g.num_values(), Tensor());
  for (NodeId id : plan_.order) {
    const Node& n = g.node(id);
    if (n.op->name == "input") {
      auto it = feeds.find(n.name);
      QG_CHECK(it != feeds.end(), "static_run", "graph input '", n.name, "' was not fed");
      values_[n.outputs[0]] = it->second.device() == device ? it->second : it->second.to(device);
      input_ids_[n.name] = n.outputs[0];
      continue;
    }
    if (n.op->is_source) {  // constants and parameters hand out their state tensor
      values_[n.outputs[0]] = exec.states(id).at(0);
      continue;
    }
    if (n.op->aliases_input) {
      // A placeholder of the right type over the viewed bytes; the kernel hands out the
      // same view on every launch.
      const TensorType& t = g.value(n.outputs[0]).type;
      values_[n.outputs[0]] = values_[n.inputs[0]].view(0, t.shape, t.dtype);
    } else {
      for (ValueId out : n.outputs) {
        const TensorType& t = g.value(out).type;
        const PlannedBuffer* b = plan_.find(out);
        QG_CHECK(b != nullptr, "static_run", "value ", out, " of '", n.name, "' was not planned");
        values_[out] = planned_ ? arena_.view(b->offset, t.shape, t.dtype)
                                : Tensor::empty(t.shape, t.dtype, device);
      }
    }
    const std::vector<DType> key = g.input_dtypes(n);
    const KernelDef* k = n.op->find_kernel(device.type, key);
    QG_CHECK(k != nullptr, n.op->name, "no kernel for ", device.str(), " and inputs ",
             signature_str(key, n.op->inputs));
    steps_.push_back({id, k, g.prepare_args(n)});
  }
}

StaticRun::~StaticRun() = default;

void StaticRun::bind_input(const std::string& name, const Tensor& value) {
  auto it = input_ids_.find(name);
  QG_CHECK(it != input_ids_.end(), "static_run", "no graph input named '", name, "'");
  QG_CHECK(!captured(), "static_run", "input '", name,
           "' cannot be rebound after capture (the CUDA graph reads the bound tensor's "
           "address); use write_input to copy new data into it");
  const Tensor& old = values_[it->second];
  QG_CHECK(value.dtype() == old.dtype() && value.shape() == old.shape() &&
               value.device() == old.device(),
           "static_run", "input '", name, "' is ", old.str(), ", got ", value.str());
  values_[it->second] = value;
}

void StaticRun::write_input(const std::string& name, const Tensor& value) {
  auto it = input_ids_.find(name);
  QG_CHECK(it != input_ids_.end(), "static_run", "no graph input named '", name, "'");
  const Tensor& dst = values_[it->second];
  QG_CHECK(value.dtype() == dst.dtype() && value.shape() == dst.shape() && value.is_contiguous(),
           "static_run", "input '", name, "' is ", dst.str(), ", got ", value.str());
  // On the executor's stream: ordered after the launches already queued, which may still
  // read the old contents.
  exec_.context().copy(dst.raw_data(), dst.device(), value.raw_data(), value.device(),
                       dst.nbytes());
}

void StaticRun::launch() {
  const Graph& g = exec_.graph();
  // Temporaries kernels allocate come from the scratch pool for the whole launch.
  ScopedAllocator scope(exec_.device().type, scratch_.get());
  DeviceContext& context = exec_.context();
  context.make_current();
  scratch_->begin_launch();
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    const Node& n = g.node(s.node);
    scratch_->begin_step(static_cast<int>(i));
    {
      std::vector<Tensor> inputs, outputs;
      for (ValueId in : n.inputs) inputs.push_back(values_[in]);
      for (ValueId out : n.outputs) outputs.push_back(values_[out]);
      std::vector<Tensor>& states = const_cast<std::vector<Tensor>&>(exec_.states(s.node));
      KernelContext ctx(n.op->name, *s.prepared, n.attrs, std::move(inputs), std::move(outputs),
                        states, context, training_);
      ctx.site = s.node;
      ctx.site_name = &n.name;
      s.kernel->fn(ctx);
      // Views (reshape, stop_gradient) hand out their input; planned outputs stay put.
      for (size_t k = 0; k < n.outputs.size(); ++k) values_[n.outputs[k]] = ctx.outputs[k];
    }
    scratch_->end_step(n.op->name);
  }
  scratch_->end_launch();
  launched_ = true;
}

void StaticRun::capture() {
  QG_CHECK(!exec_.device().is_cpu(), "static_run",
           "capture needs a CUDA executor; this one runs on ", exec_.device().str());
  QG_CHECK(launched_, "static_run",
           "capture needs one launch() first (it records the kernels' temporaries and their "
           "one-time set-up, neither of which may happen while capturing)");
  graph_.capture(exec_.stream(), [this] { launch(); });
}

void StaticRun::replay() {
  exec_.context().make_current();
  graph_.replay(exec_.stream());
}

void StaticRun::synchronize() {
  exec_.context().check_errors(&exec_.graph());
}

}  // namespace qg

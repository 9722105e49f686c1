#include "train/optimizer.h"

#include <cmath>
#include <map>

#include "autograd/grad.h"
#include "core/error.h"

namespace qg::nn {
namespace {

// The adamw node's attributes: decoupled decay for adamw, Adam's L2 term for adam.
Attrs adamw_attrs(const OptimizerConfig& c) {
  return {{"beta1", c.beta1},
          {"beta2", c.beta2},
          {"eps", c.eps},
          {"weight_decay", c.weight_decay},
          {"decoupled", c.kind == "adamw"}};
}

}  // namespace

bool OptimizerConfig::has_runtime_lr() const {
  return kind == "adamw" || (kind == "adam" && (runtime_lr || clip_grad_norm > 0.0));
}

void OptimizerConfig::validate() const {
  QG_CHECK(kind == "adam" || kind == "adamw" || kind == "sgd", "nn.optimizer", "optimizer '", kind,
           "' is not one of adam, adamw, sgd");
  QG_CHECK(std::isfinite(lr) && lr > 0.0, "nn.optimizer", "learning rate ", lr,
           " must be finite and > 0");
  QG_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, "nn.optimizer", "weight_decay ",
           weight_decay, " must be finite and >= 0");
  QG_CHECK(std::isfinite(clip_grad_norm) && clip_grad_norm >= 0.0, "nn.optimizer",
           "clip_grad_norm ", clip_grad_norm, " must be finite and > 0 (or 0: no clipping)");
  for (const auto& [name, f] : lr_factors)
    QG_CHECK(std::isfinite(f) && f > 0.0, "nn.optimizer", "the rate factor ", f, " of parameter '",
             name, "' must be finite and > 0");
  QG_CHECK(kind != "sgd" || (clip_grad_norm == 0.0 && !runtime_lr), "nn.optimizer",
           "sgd takes its rate as an attribute and does not clip; clip_grad_norm and a runtime "
           "rate need adam or adamw");
}

OptimizerNodes optimizer_nodes(const OptimizerConfig& config) {
  config.validate();
  const std::string kind = config.kind;
  if (config.has_runtime_lr()) {
    return [config, kind](Graph& graph, const std::vector<ValueId>& params,
                          const std::vector<ValueId>& grads) {
      QG_CHECK(params.size() == grads.size(), "nn.optimizer", params.size(), " parameters but ",
               grads.size(), " gradients");
      QG_CHECK(!params.empty(), "nn.optimizer", "no parameters to update");
      const ValueId lr =
          graph.variable(kLearningRateName, Tensor::from_doubles({}, {config.lr}, DType::f64));
      ValueId scale;
      if (config.clip_grad_norm > 0.0) {
        std::vector<ValueId> norm = graph.apply(
            "clip_grad_norm", grads, {{"max_norm", config.clip_grad_norm}}, "optimizer.clip");
        graph.set_name(norm[0], kGradNormName);
        scale = norm[1];
      } else {
        // An exact 1: the update's g * 1 leaves every gradient as it is.
        scale = graph.constant(Tensor::from_doubles({}, {1.0}, DType::f32), "optimizer.no_clip");
      }
      const Attrs attrs = adamw_attrs(config);
      // One scaled rate per distinct factor, computed from the variable on every run.
      std::map<double, ValueId> scaled_lr;
      auto rate_of = [&](const std::string& name) {
        auto f = config.lr_factors.find(name);
        if (f == config.lr_factors.end() || f->second == 1.0) return lr;
        auto [it, fresh] = scaled_lr.emplace(f->second, kNoValue);
        if (fresh) {
          const std::string id = "optimizer.lr_factor" + std::to_string(scaled_lr.size() - 1);
          ValueId factor = graph.constant(Tensor::from_doubles({}, {f->second}, DType::f64), id);
          it->second = graph.apply1("mul", {lr, factor}, {}, id + ".lr");
        }
        return it->second;
      };
      std::vector<NodeId> steps;
      for (size_t i = 0; i < params.size(); ++i) {
        std::vector<NodeId> readers = graph.consumers(params[i]);
        const ValueId rate = rate_of(graph.value(params[i]).name);
        graph.apply("adamw", {params[i], grads[i], rate, scale}, attrs,
                    graph.value(params[i]).name + "." + kind);
        NodeId step = graph.num_nodes() - 1;
        for (NodeId r : readers) graph.add_control_dependency(r, step);
        steps.push_back(step);
      }
      return steps;
    };
  }
  Attrs attrs;
  if (kind == "adam") {
    attrs = {{"lr", config.lr},
             {"beta1", config.beta1},
             {"beta2", config.beta2},
             {"eps", config.eps},
             {"weight_decay", config.weight_decay}};
  } else {
    attrs = {
        {"lr", config.lr}, {"momentum", config.momentum}, {"weight_decay", config.weight_decay}};
  }
  const std::map<std::string, double> factors = config.lr_factors;
  return [attrs, kind, factors](Graph& graph, const std::vector<ValueId>& params,
                                const std::vector<ValueId>& grads) {
    QG_CHECK(params.size() == grads.size(), "nn.optimizer", params.size(), " parameters but ",
             grads.size(), " gradients");
    std::vector<NodeId> steps;
    for (size_t i = 0; i < params.size(); ++i) {
      // Readers are collected before the step node exists, so it is not its own dependency.
      std::vector<NodeId> readers = graph.consumers(params[i]);
      const std::string& name = graph.value(params[i]).name;
      Attrs mine = attrs;
      auto f = factors.find(name);
      if (f != factors.end()) mine.set("lr", attrs.get_real("lr") * f->second);
      graph.apply(kind, {params[i], grads[i]}, mine, name + "." + kind);
      // The step has no outputs; with Boost's vecS storage it is the newest vertex.
      NodeId step = graph.num_nodes() - 1;
      for (NodeId r : readers) graph.add_control_dependency(r, step);
      steps.push_back(step);
    }
    // A reader of parameter j may also be a node step i depends on; ordering each step after
    // all readers of its own parameter is enough because steps only write their own
    // parameter.
    return steps;
  };
}

std::vector<NodeId> add_optimizer(Graph& graph, ValueId loss, const std::vector<ValueId>& params,
                                  const OptimizerConfig& config) {
  OptimizerNodes build = optimizer_nodes(config);  // an unknown kind fails before autograd
  for (ValueId p : params)
    QG_CHECK(graph.node(graph.value(p).producer).op->name == "parameter", "nn.optimizer", "value '",
             graph.value(p).name, "' is not a parameter");
  return build(graph, params, grad(graph, loss, params));
}

void set_learning_rate(Executor& exec, double lr) {
  QG_CHECK(std::isfinite(lr) && lr >= 0.0, "nn.optimizer", "learning rate ", lr,
           " must be finite and >= 0");
  const Graph& g = exec.graph();
  const ValueId v = g.find(kLearningRateName);
  QG_CHECK(v != kNoValue && g.node(g.value(v).producer).op->name == "variable", "nn.optimizer",
           "this graph has no runtime learning rate ('", kLearningRateName,
           "'): its optimizer takes the rate as an attribute (sgd, or adam without runtime_lr)");
  Tensor& dst = exec.state(g.value(v).producer, "value");
  const double host = lr;
  copy_bytes(dst.raw_data(), dst.device(), &host, Device::cpu(), sizeof host);
}

ValueId grad_norm_value(const Graph& graph) {
  return graph.find(kGradNormName);
}

}  // namespace qg::nn

// The parsed arguments of fused_ste_mul_pair: whether each mul read the masked gradient as its
// first operand (attributes a_slot and b_slot: 0 or 1).
#pragma once

#include <memory>

#include "core/error.h"
#include "core/kernel_args.h"

namespace qg {

struct SteMulPairArgs : KernelArgs {
  bool a_first = true, b_first = true;
};

inline std::shared_ptr<const KernelArgs> parse_ste_mul_pair_args(const ArgsSource& s) {
  auto args = std::make_shared<SteMulPairArgs>();
  for (const char* name : {"a_slot", "b_slot"}) {
    const int64_t slot = s.attrs.get_int(name);
    QG_CHECK(slot == 0 || slot == 1, "fused_ste_mul_pair", "attribute '", name, "' = ", slot,
             " must be 0 or 1");
  }
  args->a_first = s.attrs.get_int("a_slot") == 0;
  args->b_first = s.attrs.get_int("b_slot") == 0;
  return args;
}

}  // namespace qg

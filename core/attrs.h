// Typed op attributes. `Attr` wraps a variant with explicit constructors so that literals such
// as 8, 0.5, true and "affine" land in the intended alternative.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace qg {

enum class AttrType { integer, real, boolean, string, int_list };
const char* attr_type_name(AttrType t);

class Attr {
 public:
  Attr() : v_(int64_t{0}) {}
  Attr(int v) : v_(int64_t{v}) {}
  Attr(int64_t v) : v_(v) {}
  Attr(double v) : v_(v) {}
  Attr(bool v) : v_(v) {}
  Attr(const char* v) : v_(std::string(v)) {}
  Attr(std::string v) : v_(std::move(v)) {}
  Attr(std::vector<int64_t> v) : v_(std::move(v)) {}
  Attr(std::initializer_list<int64_t> v) : v_(std::vector<int64_t>(v)) {}

  AttrType type() const { return static_cast<AttrType>(v_.index()); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_real() const;  // integers widen to real
  bool as_bool() const { return std::get<bool>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const std::vector<int64_t>& as_ints() const { return std::get<std::vector<int64_t>>(v_); }
  std::string str() const;
  bool operator==(const Attr& o) const { return v_ == o.v_; }

 private:
  std::variant<int64_t, double, bool, std::string, std::vector<int64_t>> v_;
};

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, Attr>> init) : values_(init) {}

  Attrs& set(const std::string& name, Attr value) {
    values_[name] = std::move(value);
    return *this;
  }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const Attr& at(const std::string& name) const;  // throws qg::Error when missing
  int64_t get_int(const std::string& name) const { return at(name).as_int(); }
  double get_real(const std::string& name) const { return at(name).as_real(); }
  bool get_bool(const std::string& name) const { return at(name).as_bool(); }
  const std::string& get_string(const std::string& name) const { return at(name).as_string(); }
  const std::vector<int64_t>& get_ints(const std::string& name) const { return at(name).as_ints(); }
  const std::map<std::string, Attr>& items() const { return values_; }
  std::string str() const;

 private:
  std::map<std::string, Attr> values_;
};

}  // namespace qg

#include "core/attrs.h"

#include <sstream>

#include "core/error.h"

namespace qg {

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::integer:
      return "int";
    case AttrType::real:
      return "float";
    case AttrType::boolean:
      return "bool";
    case AttrType::string:
      return "string";
    case AttrType::int_list:
      return "int list";
  }
  return "?";
}

double Attr::as_real() const {
  if (type() == AttrType::integer) return static_cast<double>(as_int());
  return std::get<double>(v_);
}

std::string Attr::str() const {
  std::ostringstream os;
  switch (type()) {
    case AttrType::integer:
      os << as_int();
      break;
    case AttrType::real:
      os << std::get<double>(v_);
      break;
    case AttrType::boolean:
      os << (as_bool() ? "true" : "false");
      break;
    case AttrType::string:
      os << '"' << as_string() << '"';
      break;
    case AttrType::int_list: {
      os << "[";
      const auto& v = as_ints();
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
      os << "]";
      break;
    }
  }
  return os.str();
}

const Attr& Attrs::at(const std::string& name) const {
  auto it = values_.find(name);
  QG_CHECK(it != values_.end(), "attrs", "attribute '", name, "' is not set");
  return it->second;
}

std::string Attrs::str() const {
  std::string s;
  for (const auto& [k, v] : values_) s += (s.empty() ? "" : ", ") + k + "=" + v.str();
  return s;
}

}  // namespace qg

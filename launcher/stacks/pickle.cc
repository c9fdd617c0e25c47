#include "launcher/stacks/pickle.h"

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dlrun::launcher {
namespace {

using nlohmann::json;

// Values built, copies included (a 2,000-entry dump is ~100,000; more with stack traces): a
// memo reference copied over and over cannot blow up memory.
constexpr uint64_t kMaxNodes = 1'000'000;

// A value being built, shared between the stack and the memo (pickle's memo holds references:
// a container is memoized empty and filled afterwards).
struct Node {
  json value;
  uint64_t nodes = 1;  // values inside, itself included
  std::string global;  // a GLOBAL's "module.name" (value is null then)
};
using NodePtr = std::shared_ptr<Node>;

class Unpickler {
 public:
  explicit Unpickler(std::string_view b) : b_(b) {}

  absl::StatusOr<json> Run() {
    while (pos_ < b_.size()) {
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(b_[pos_++]);
      absl::Status s = Step(op);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrFormat(
                         "pickle opcode 0x%02x at byte %d: %s", op, at, s.message()));
      if (done_) {
        if (stack_.size() != 1 || !marks_.empty()) {
          return absl::InvalidArgumentError("pickle STOP with an unbalanced stack");
        }
        return std::move(stack_.back()->value);
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("pickle ends without STOP after ", b_.size(), " bytes (truncated?)"));
  }

 private:
  absl::Status Need(size_t n) {
    if (b_.size() - pos_ < n) {
      return absl::InvalidArgumentError(absl::StrCat("needs ", n, " more bytes, has ",
                                                     b_.size() - pos_));
    }
    return absl::OkStatus();
  }
  uint64_t Le(size_t n) {  // Need(n) checked
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  absl::Status Push(json v) {
    auto n = std::make_shared<Node>();
    n->value = std::move(v);
    return PushNode(std::move(n));
  }
  absl::Status PushNode(NodePtr n) {
    if (stack_.size() > 1'000'000) return absl::InvalidArgumentError("stack too deep");
    stack_.push_back(std::move(n));
    return absl::OkStatus();
  }
  absl::StatusOr<NodePtr> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return absl::InvalidArgumentError("pops an empty stack");
    }
    NodePtr n = std::move(stack_.back());
    stack_.pop_back();
    return n;
  }
  // The values since the last MARK, which is dropped.
  absl::StatusOr<std::vector<NodePtr>> PopMark() {
    if (marks_.empty()) return absl::InvalidArgumentError("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<NodePtr> items(std::make_move_iterator(stack_.begin() + static_cast<long>(m)),
                               std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  absl::Status Count(uint64_t n) {
    total_ += n;
    if (total_ > kMaxNodes) return absl::InvalidArgumentError("too many values");
    return absl::OkStatus();
  }
  absl::Status Append(Node* list, const std::vector<NodePtr>& items) {
    if (!list->value.is_array()) return absl::InvalidArgumentError("appends to a non-list");
    for (const NodePtr& i : items) {
      if (absl::Status s = Count(i->nodes); !s.ok()) return s;
      list->value.push_back(i->value);
      list->nodes += i->nodes;
    }
    return absl::OkStatus();
  }
  absl::Status SetItems(Node* dict, const std::vector<NodePtr>& items) {
    if (!dict->value.is_object()) return absl::InvalidArgumentError("sets items of a non-dict");
    if (items.size() % 2 != 0) return absl::InvalidArgumentError("odd number of dict items");
    for (size_t i = 0; i < items.size(); i += 2) {
      const json& k = items[i]->value;
      std::string key;
      if (k.is_string()) {
        key = k.get<std::string>();
      } else if (k.is_number_integer()) {
        key = std::to_string(k.get<int64_t>());
      } else {
        return absl::InvalidArgumentError(absl::StrCat("a dict key of type ", k.type_name()));
      }
      if (absl::Status s = Count(items[i + 1]->nodes); !s.ok()) return s;
      dict->value[key] = items[i + 1]->value;
      dict->nodes += items[i + 1]->nodes;
    }
    return absl::OkStatus();
  }
  absl::Status Tuple(std::vector<NodePtr> items) {
    auto t = std::make_shared<Node>();
    t->value = json::array();
    if (absl::Status s = Append(t.get(), items); !s.ok()) return s;
    return PushNode(std::move(t));
  }
  absl::Status Text(size_t len_bytes) {
    if (absl::Status s = Need(len_bytes); !s.ok()) return s;
    const uint64_t n = Le(len_bytes);
    if (absl::Status s = Need(n); !s.ok()) return s;
    std::string v(b_.substr(pos_, n));
    pos_ += n;
    return Push(std::move(v));
  }
  absl::Status Put(uint64_t index) {
    if (stack_.empty()) return absl::InvalidArgumentError("memoizes an empty stack");
    if (index > 10'000'000) return absl::InvalidArgumentError("memo index too large");
    memo_[index] = stack_.back();
    return absl::OkStatus();
  }
  absl::Status Get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return absl::InvalidArgumentError(absl::StrCat("no memo ", index));
    if (absl::Status s = Count(it->second->nodes); !s.ok()) return s;
    return PushNode(it->second);
  }

  // REDUCE: only torch's typed-list builders, which return their argument.
  absl::Status Reduce() {
    auto args = Pop();
    if (!args.ok()) return args.status();
    auto callable = Pop();
    if (!callable.ok()) return callable.status();
    const std::string& g = (*callable)->global;
    if (!absl::StartsWith(g, "torch.jit._pickle.build_") &&
        g != "torch.jit._pickle.restore_type_tag") {
      return absl::InvalidArgumentError(
          absl::StrCat("calls '", g.empty() ? "a non-global" : g,
                       "' (a plain-data dump calls only torch.jit._pickle's list builders)"));
    }
    if (!(*args)->value.is_array() || (*args)->value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("'", g, "' without an argument"));
    }
    auto n = std::make_shared<Node>();
    n->value = (*args)->value[0];
    n->nodes = (*args)->nodes;
    return PushNode(std::move(n));
  }

  absl::Status Step(unsigned char op) {
    switch (op) {
      case 0x80:  // PROTO
        if (absl::Status s = Need(1); !s.ok()) return s;
        ++pos_;
        return absl::OkStatus();
      case 0x95:  // FRAME (protocol 4): a length to skip
        if (absl::Status s = Need(8); !s.ok()) return s;
        pos_ += 8;
        return absl::OkStatus();
      case '.':
        done_ = true;
        return absl::OkStatus();
      case '(':
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case '}': return Push(json::object());
      case ']': return Push(json::array());
      case ')': return Push(json::array());
      case 'N': return Push(nullptr);
      case 0x88: return Push(true);
      case 0x89: return Push(false);
      case 'K':
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Push(static_cast<int64_t>(Le(1)));
      case 'M':
        if (absl::Status s = Need(2); !s.ok()) return s;
        return Push(static_cast<int64_t>(Le(2)));
      case 'J':
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Push(static_cast<int64_t>(static_cast<int32_t>(Le(4))));
      case 0x8a: {  // LONG1: n bytes, little-endian two's complement
        if (absl::Status s = Need(1); !s.ok()) return s;
        const size_t n = Le(1);
        if (n > 8) return absl::InvalidArgumentError("an integer wider than 64 bits");
        if (absl::Status s = Need(n); !s.ok()) return s;
        uint64_t v = Le(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign
        return Push(static_cast<int64_t>(v));
      }
      case 'G': {  // BINFLOAT: big-endian double
        if (absl::Status s = Need(8); !s.ok()) return s;
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(b_[pos_ + i]);
        pos_ += 8;
        double d;
        std::memcpy(&d, &v, sizeof d);
        return Push(d);
      }
      case 'X': case 'T': case 'B': return Text(4);
      case 0x8c: case 'U': case 'C': return Text(1);
      case 0x8d: case 0x8e: return Text(8);
      case 'q':
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Put(Le(1));
      case 'r':
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Put(Le(4));
      case 0x94: return Put(memo_.size());  // MEMOIZE
      case 'h':
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Get(Le(1));
      case 'j':
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Get(Le(4));
      default:
        return Build(op);
    }
  }

  // The opcodes that build containers, tuples and globals from what the stack holds.
  absl::Status Build(unsigned char op) {
    switch (op) {
      case 'a': case 'e': case 's': case 'u': {
        std::vector<NodePtr> items;
        if (op == 'a' || op == 's') {
          for (int i = op == 'a' ? 1 : 2; i > 0; --i) {
            auto v = Pop();
            if (!v.ok()) return v.status();
            items.insert(items.begin(), *std::move(v));
          }
        } else {
          auto v = PopMark();
          if (!v.ok()) return v.status();
          items = *std::move(v);
        }
        if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
          return absl::InvalidArgumentError("no container to add to");
        }
        Node* target = stack_.back().get();
        return op == 'a' || op == 'e' ? Append(target, items) : SetItems(target, items);
      }
      case 't': case 'l': case 'd': {
        auto items = PopMark();
        if (!items.ok()) return items.status();
        if (op == 'd') {
          auto d = std::make_shared<Node>();
          d->value = json::object();
          if (absl::Status s = SetItems(d.get(), *items); !s.ok()) return s;
          return PushNode(std::move(d));
        }
        return Tuple(*std::move(items));
      }
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        std::vector<NodePtr> items(op - 0x84);
        for (size_t i = items.size(); i > 0; --i) {
          auto v = Pop();
          if (!v.ok()) return v.status();
          items[i - 1] = *std::move(v);
        }
        return Tuple(std::move(items));
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string parts[2];
        for (std::string& p : parts) {
          const size_t nl = b_.find('\n', pos_);
          if (nl == std::string_view::npos) return absl::InvalidArgumentError("unterminated GLOBAL");
          p = std::string(b_.substr(pos_, nl - pos_));
          pos_ = nl + 1;
        }
        auto n = std::make_shared<Node>();
        n->global = absl::StrCat(parts[0], ".", parts[1]);
        return PushNode(std::move(n));
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = Pop();
        if (!name.ok()) return name.status();
        auto module = Pop();
        if (!module.ok()) return module.status();
        if (!(*name)->value.is_string() || !(*module)->value.is_string()) {
          return absl::InvalidArgumentError("STACK_GLOBAL without two strings");
        }
        auto n = std::make_shared<Node>();
        n->global = absl::StrCat((*module)->value.get<std::string>(), ".",
                                 (*name)->value.get<std::string>());
        return PushNode(std::move(n));
      }
      case 'R': return Reduce();
      default:
        return absl::InvalidArgumentError("not an opcode of a plain-data pickle");
    }
  }

  std::string_view b_;
  size_t pos_ = 0;
  bool done_ = false;
  uint64_t total_ = 0;
  std::vector<NodePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, NodePtr> memo_;
};

}  // namespace

absl::StatusOr<json> ReadPickle(std::string_view bytes) { return Unpickler(bytes).Run(); }

}  // namespace dlrun::launcher

// Python's operators and jinja2's sandboxed attribute and item access, on Values.
//
// These reproduce what a template expression does in jinja2: `a + b` with Python's
// types and errors (int/float promotion, floor division and modulo with the divisor's
// sign, str % args), comparisons and `in`, `obj.attr` (a Python attribute such as a str
// method first, then the dict key, as the sandbox's getattr does), `obj[key]` (the item
// first, then the attribute), and slices. A missing attribute, key or index is an
// undefined value carrying jinja2's message; using an undefined operand is an error.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/jinja/value.h"

namespace conveyor::jinja {

enum class ArithmeticOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

// a op b. Integers are 64-bit: a result that overflows is an error, where Python would
// grow the integer.
absl::StatusOr<Value> Arithmetic(ArithmeticOp op, const Value& a, const Value& b);
// -v (negate) or +v.
absl::StatusOr<Value> UnaryArithmetic(const Value& v, bool negate);
// a op b for one link of a comparison chain.
absl::StatusOr<bool> Compare(CompareOp op, const Value& a, const Value& b);
// Python's a < b (what sorted() uses).
absl::StatusOr<bool> Less(const Value& a, const Value& b);
// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// obj.name in a template.
absl::StatusOr<Value> GetAttr(const Value& object, std::string_view name);
// obj[key] in a template.
absl::StatusOr<Value> GetItem(const Value& object, const Value& key);
// obj[start:stop:step]; None for an omitted part. Like jinja2 (which compiles slices to
// Python subscripts), slicing something that is not a sequence is an error.
absl::StatusOr<Value> Slice(const Value& object, const Value& start, const Value& stop,
                            const Value& step);

// Python's `format % args` (printf-style): %s %r %d %i %f %e %g %x %o %c %% with flags,
// width and precision, and %(name)s with a dict.
absl::StatusOr<std::string> PercentFormat(std::string_view format, const Value& args);

// The items that Python's integer index `index` and slice bounds refer to in a sequence
// of `length`: Python's normalisation of negative and out-of-range values.
struct SliceIndices {
  int64_t start, stop, step;
};
absl::StatusOr<SliceIndices> AdjustSlice(int64_t length, const Value& start, const Value& stop,
                                         const Value& step);

// Stable sort with a comparison that can fail, as Python's sorted() raises TypeError on
// items it cannot order: a merge sort that stops at the first error (std::stable_sort
// would need a comparison that cannot fail).
template <typename T, typename LessFn>
absl::Status StableSort(std::vector<T>* items, LessFn less) {
  std::vector<T> buffer(items->size());
  for (size_t width = 1; width < items->size(); width *= 2) {
    for (size_t lo = 0; lo < items->size(); lo += 2 * width) {
      const size_t mid = std::min(lo + width, items->size());
      const size_t hi = std::min(lo + 2 * width, items->size());
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        // Take from the right run only when strictly less: that keeps equal items in order.
        absl::StatusOr<bool> right_first = less((*items)[j], (*items)[i]);
        if (!right_first.ok()) return right_first.status();
        buffer[k++] = std::move(*right_first ? (*items)[j++] : (*items)[i++]);
      }
      while (i < mid) buffer[k++] = std::move((*items)[i++]);
      while (j < hi) buffer[k++] = std::move((*items)[j++]);
    }
    items->swap(buffer);
  }
  return absl::OkStatus();
}

}  // namespace conveyor::jinja

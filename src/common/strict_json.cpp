#include "common/strict_json.hpp"

#include <cstddef>
#include <memory>
#include <set>
#include <vector>

namespace embcache::detail {

namespace {

// The parser's position: one frame per open object or array, with the keys seen so far (an
// object) or the index of the current element (an array).
struct json_frame {
  bool object = true;
  std::set<std::string> keys;
  std::string key;        // the object's current key
  std::size_t index = 0;  // the array's elements started so far
};

std::string place_of(const std::string& root, const std::vector<json_frame>& frames,
                     std::size_t depth) {
  std::string out = root;
  for (std::size_t i = 0; i < depth; ++i) {
    const json_frame& f = frames[i];
    if (f.object)
      out += "." + f.key;
    else
      out += "[" + std::to_string(f.index - 1) + "]";
  }
  return out;
}

// The parser callback: counts array elements and checks keys; the first duplicate is kept in
// `duplicate` and the parse goes on (nlohmann's callbacks cannot stop it with a message).
class unique_key_checker {
 public:
  explicit unique_key_checker(const std::string& root) : root_(root) {}

  bool operator()(int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using ev = nlohmann::json::parse_event_t;
    switch (event) {
      case ev::object_start:
      case ev::array_start:
        start_element();
        frames_.push_back(json_frame{event == ev::object_start, {}, {}, 0});
        break;
      case ev::object_end:
      case ev::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case ev::key: {
        if (frames_.empty()) break;
        json_frame& f = frames_.back();
        const std::string k = parsed.is_string() ? parsed.get<std::string>() : parsed.dump();
        if (!f.keys.insert(k).second && duplicate_.empty())
          duplicate_ = "duplicate key \"" + k + "\" in " +
                       place_of(root_, frames_, frames_.size() - 1) + " (JSON keys must be unique)";
        f.key = k;
        break;
      }
      case ev::value:
        start_element();
        break;
    }
    return true;
  }

  const std::string& duplicate() const noexcept { return duplicate_; }

 private:
  void start_element() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }

  std::string root_;
  std::vector<json_frame> frames_;
  std::string duplicate_;
};

}  // namespace

result<nlohmann::json> parse_json_unique_keys(std::string_view text, const std::string& origin,
                                              const std::string& root) {
  // The callback is copied into the parser: the result is read through a shared checker.
  auto checker = std::make_shared<unique_key_checker>(root);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(
        text.begin(), text.end(),
        [checker](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          return (*checker)(depth, event, parsed);
        });
  } catch (const nlohmann::json::exception& e) {
    return status::invalid_argument(origin + ": not valid JSON: " + e.what());
  }
  if (!checker->duplicate().empty())
    return status::invalid_argument(origin + ": " + checker->duplicate());
  return j;
}

}  // namespace embcache::detail

// The configuration's admission fields: `tables[i].admission`, read, checked and written.
#include "trainer_config_admission.hpp"

#include "embcache/admission.hpp"
#include "embcache/trainer/trainer.hpp"

namespace embcache::detail {

namespace {
const int_range count_range{0, 0xffffffffULL};           // min_count
const int_range width_range{1, std::uint64_t{1} << 32};  // sketch_width
const int_range depth_range{1, 16};                      // sketch_depth
const real_range probability_range{0, 1, false, false};  // probability: [0, 1]
}  // namespace

void read_admission_fields(object_reader& r, const std::string& at, trainer_table_config& tc,
                           status* err) {
  if (!r.has("admission") || !err->ok()) return;
  object_reader a(r.at("admission"), at + ".admission", err);
  admission_options& o = tc.admission;
  a.get_int("min_count", o.min_count, count_range);
  a.get_real("probability", o.probability, probability_range);
  a.get_int("sketch_width", o.sketch_width, width_range);
  a.get_int("sketch_depth", o.sketch_depth, depth_range);
  a.get_int("seed", o.seed, {0, max_u64});
  if (a.has("default_row") && err->ok()) {
    const json& v = a.at("default_row");
    if (v == "zeros") {
      o.default_row = refused_row::zeros;
    } else if (v == "slot") {
      o.default_row = refused_row::slot;
    } else {
      a.fail(a.path("default_row"), "expected \"zeros\" or \"slot\", got " + shown(v));
    }
  }
  a.finish();
}

status validate_admission_fields(const trainer_table_config& tc, const std::string& at) {
  const admission_options& o = tc.admission;
  EMBCACHE_RETURN_IF_ERROR(check_int(at + ".admission.min_count", o.min_count, count_range));
  EMBCACHE_RETURN_IF_ERROR(
      check_real(at + ".admission.probability", o.probability, probability_range));
  EMBCACHE_RETURN_IF_ERROR(check_admission_options(o, at + ".admission"));
  if (o.default_row != refused_row::zeros && !o.enabled()) {
    return status::invalid_argument(at +
                                    ".admission.default_row: \"slot\" needs admission on "
                                    "(min_count or probability), as only refused keys read it");
  }
  return {};
}

void admission_fields_json(const trainer_table_config& tc, json& j) {
  const admission_options& o = tc.admission;
  const admission_options d{};
  if (o.min_count == d.min_count && o.probability == d.probability &&
      o.sketch_width == d.sketch_width && o.sketch_depth == d.sketch_depth && o.seed == d.seed &&
      o.default_row == d.default_row)
    return;  // the default (off): nothing written, as before admission existed
  j["admission"] = {{"min_count", o.min_count},
                    {"probability", o.probability},
                    {"sketch_width", o.sketch_width},
                    {"sketch_depth", o.sketch_depth},
                    {"seed", o.seed}};
  if (o.default_row != d.default_row) j["admission"]["default_row"] = "slot";
}

}  // namespace embcache::detail

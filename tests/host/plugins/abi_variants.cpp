// Plugins that break the ABI rules one at a time, for the loader's rejection tests. Each is this
// file compiled with one VARIANT. They are written against plugin.h alone (no helper), as a
// careless third party might write them; their functions beyond describe only say so.
#include <attnhost/plugin.h>

#include <stdexcept>

#define V_GOOD 1           // a valid plugin named "abi_good"
#define V_DUPLICATE 2      // valid, also named "abi_good"
#define V_NO_ENTRY 3       // exports no entry symbol
#define V_ABI_MAJOR_2 4    // reports ABI 2.0
#define V_DESCRIBE_FAILS 5 // describe returns an error
#define V_DESCRIBE_THROWS 6// describe throws a C++ exception across the C ABI
#define V_REFUSES 7        // the entry returns NULL
#define V_MISSING_SYMBOL 8 // needs a symbol nothing defines
#define V_SMALL_TABLE 9    // table struct_size too small for ABI 1.0
#define V_WIDE_PARAMS 10   // "abi_wide": parameter specs larger than this header's, as a later minor may write

struct attnhost_error {
  const char* message;
};

namespace {

attnhost_error g_error{"this test plugin computes nothing"};

// A parameter spec of a later minor: this header's fields, then one it does not know.
struct WideSpec {
  attnhost_param_spec spec;
  const char* later_field;
};
const WideSpec kWide[2] = {
    {{sizeof(WideSpec), "first", ATTNHOST_PARAM_INT, "1", "the first", nullptr}, "unknown to this host"},
    {{sizeof(WideSpec), "second", ATTNHOST_PARAM_STRING, "\"b\"", "the second", "a|b"}, "unknown to this host"},
};

const attnhost_plugin_info kInfo = {
    ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
    VARIANT == V_WIDE_PARAMS ? "abi_wide" : "abi_good",
    VARIANT == V_DUPLICATE ? "2.0.0" : "1.0.0",
    "loader test plugin",
    {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), ATTNHOST_CAP_DEVICE_CPU,
     ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_BF16), ATTNHOST_FEATURE_CAUSAL, 1, 1, 0, nullptr},
    VARIANT == V_WIDE_PARAMS ? 2 : 0,
    VARIANT == V_WIDE_PARAMS ? &kWide[0].spec : nullptr,
};

#if VARIANT == V_MISSING_SYMBOL
extern "C" int attnhost_test_symbol_nobody_defines(void);
#endif

attnhost_error* describe(const attnhost_plugin_info** out) {
#if VARIANT == V_DESCRIBE_FAILS
  (void)out;
  static attnhost_error failed{"describe: licence file not found"};
  return &failed;
#elif VARIANT == V_DESCRIBE_THROWS
  (void)out;
  throw std::runtime_error("describe threw");
#else
#if VARIANT == V_MISSING_SYMBOL
  if (attnhost_test_symbol_nobody_defines() == 42) return &g_error;
#endif
  *out = &kInfo;
  return nullptr;
#endif
}

attnhost_error* validate(const attnhost_problem*) { return &g_error; }
attnhost_error* create(const attnhost_problem*, const attnhost_host_api*, attnhost_instance**) { return &g_error; }
attnhost_error* layout(attnhost_instance*, int32_t, attnhost_layout*) { return &g_error; }
attnhost_error* forward(attnhost_instance*, const attnhost_forward_args*) { return &g_error; }
attnhost_error* count_pairs(attnhost_instance*, int64_t*, int64_t*) { return &g_error; }
attnhost_error* keys(attnhost_instance*, int64_t, int32_t, int64_t, attnhost_span_list*) { return &g_error; }
void destroy(attnhost_instance*) {}
const char* message(const attnhost_error* e) { return e->message; }
int32_t code(const attnhost_error*) { return ATTNHOST_ERR_UNSUPPORTED; }
void error_destroy(attnhost_error*) {}

const attnhost_plugin_api kApi = {
    VARIANT == V_SMALL_TABLE ? ATTNHOST_STRUCT_SIZE(attnhost_plugin_api, forward)
                             : ATTNHOST_STRUCT_SIZE(attnhost_plugin_api, error_destroy),
    VARIANT == V_ABI_MAJOR_2 ? 2u : ATTNHOST_ABI_MAJOR,
    ATTNHOST_ABI_MINOR,
    describe, validate, create, layout, forward, nullptr, count_pairs, keys, keys, destroy, message, code,
    error_destroy,
};

}  // namespace

#if VARIANT != V_NO_ENTRY
extern "C" __attribute__((visibility("default"))) const attnhost_plugin_api* attnhost_plugin_entry(
    const attnhost_version* host) {
  if (VARIANT == V_REFUSES || !host) return nullptr;
  return &kApi;
}
#else
extern "C" __attribute__((visibility("default"))) int some_other_library_function(void) { return 1; }
#endif

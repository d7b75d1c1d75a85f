// header_cxx: include/channels_nats.h must compile as C++ (g++ -std=c++11 -Wall -Wextra -Werror
// -pedantic) and declare every function with C linkage. Each function's address goes into a
// table with its exact type, so a changed or missing declaration fails to compile, and linking
// this file against the library (run.sh does) fails if a name is mangled or not exported.
#include "channels_nats.h"

#include <cstdio>

namespace {

typedef void (*any_fn)();

struct entry {
    const char *name;
    any_fn fn;
};

// The exact prototypes of the header, restated: a mismatch is a compile error.
const char *(*const p_version)(void) = &cn_version;
const char *(*const p_status_text)(cn_status) = &cn_status_text;
const char *(*const p_last_error)(void) = &cn_last_error;
void (*const p_free)(void *) = &cn_free;
cn_status (*const p_queue_new)(intptr_t, cn_queue *) = &cn_queue_new;
cn_status (*const p_queue_take)(cn_queue, cn_result *, size_t, size_t *) = &cn_queue_take;
cn_status (*const p_queue_free)(cn_queue) = &cn_queue_free;
cn_status (*const p_connect)(const char *, cn_log_callback, void *, cn_queue, void *,
                             cn_client *) = &cn_connect;
cn_status (*const p_close)(cn_client, cn_queue, void *) = &cn_close;
cn_status (*const p_stats)(cn_client, char **) = &cn_stats;
cn_status (*const p_send)(cn_client, const char *, const uint8_t *, size_t, cn_queue, void *,
                          cn_op *) = &cn_send;
cn_status (*const p_group_send)(cn_client, const char *, const uint8_t *, size_t, cn_queue,
                                void *, cn_op *) = &cn_group_send;
cn_status (*const p_receive)(cn_client, const char *, cn_queue, void *, const uint8_t **,
                             size_t *, cn_op *) = &cn_receive;
cn_status (*const p_cancel)(cn_client, cn_op) = &cn_cancel;
cn_status (*const p_new_channel)(cn_client, const char *, cn_queue, void *, char **,
                                 cn_op *) = &cn_new_channel;
cn_status (*const p_group_add)(cn_client, const char *, const char *, cn_queue, void *,
                               cn_op *) = &cn_group_add;
cn_status (*const p_group_discard)(cn_client, const char *, const char *) = &cn_group_discard;
cn_status (*const p_flush)(cn_client) = &cn_flush;

#define ENTRY(f) {#f, reinterpret_cast<any_fn>(&f)}

// All 18 functions of the header.
const entry all_functions[] = {
    ENTRY(cn_version),     ENTRY(cn_status_text), ENTRY(cn_last_error),  ENTRY(cn_free),
    ENTRY(cn_queue_new),   ENTRY(cn_queue_take),  ENTRY(cn_queue_free),  ENTRY(cn_connect),
    ENTRY(cn_close),       ENTRY(cn_stats),       ENTRY(cn_send),        ENTRY(cn_group_send),
    ENTRY(cn_receive),     ENTRY(cn_cancel),      ENTRY(cn_new_channel), ENTRY(cn_group_add),
    ENTRY(cn_group_discard), ENTRY(cn_flush),
};

// The result struct, the log callback type and the enums are usable from C++ as declared.
void log_callback(void *, int, const char *) {}
const cn_log_callback log_cb = &log_callback;
const cn_result empty_result = {0, 0, CN_OK, 0, 0, 0, 0};
const int levels[] = {CN_LOG_DEBUG, CN_LOG_INFO, CN_LOG_WARNING, CN_LOG_ERROR};
const cn_status first = CN_OK, last = CN_INTERNAL;

}  // namespace

int main() {
    const unsigned n = sizeof all_functions / sizeof all_functions[0];
    unsigned i, missing = 0;
    for (i = 0; i < n; i++) {
        if (all_functions[i].fn == 0) {
            std::printf("FAIL header_cxx: %s has no address\n", all_functions[i].name);
            missing++;
        }
    }
    (void)p_version; (void)p_status_text; (void)p_last_error; (void)p_free; (void)p_queue_new;
    (void)p_queue_take; (void)p_queue_free; (void)p_connect; (void)p_close; (void)p_stats;
    (void)p_send; (void)p_group_send; (void)p_receive; (void)p_cancel; (void)p_new_channel;
    (void)p_group_add; (void)p_group_discard; (void)p_flush; (void)log_cb; (void)empty_result;
    (void)levels; (void)first; (void)last;
    // cn_version() needs no client and never enters the network: a real call through C linkage.
    if (cn_version() == 0 || cn_version()[0] == '\0') {
        std::printf("FAIL header_cxx: cn_version() is empty\n");
        missing++;
    }
    std::printf("header_cxx: %u functions, library %s\n", n, cn_version());
    return missing == 0 ? 0 : 1;
}

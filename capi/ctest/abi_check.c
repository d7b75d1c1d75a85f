/*
 * abi_check: the C harness of the channels-nats C ABI (include/channels_nats.h), run against a
 * real nats-server.
 *
 *   abi_check NATS_URL                 run every check; exit 0 only when none failed
 *   abi_check NATS_URL --leak-selftest  connect, make a channel, do NOT free its name, close:
 *                                       run.sh runs it under valgrind and expects the name to be
 *                                       reported as definitely lost (proves the suppressions do
 *                                       not hide what the caller must free)
 *
 * Checks (in order): version/status texts; waiting and pending connect; connect failure (no
 * credentials in the error); new_channel names; send + immediate receive; pending receive; a plain
 * channel shared by two clients; group fan-out (one client, two clients); group_discard; cancel
 * before delivery; put_back; receive_many and put_back_many (records parsed, put back, received
 * again; malformed blocks; a waiting receive; 0 ms left); streams (results in order, stream_stop
 * with the unused credit, refused arguments, CN_OK when messages wait, one CN_CLOSED at close);
 * stats; flush; every error status with
 * cn_last_error(); waiting calls refused inside callbacks; cancel of an op never issued; the
 * "specific.<id>!" prefix receive; close abandoning a connect; concurrent threads; result queues
 * (a pipe notify watched with poll(), take, free refused while attached, untaken results
 * discarded); a waiting receive ended by close; pending close ordering (receive callbacks before
 * the close callback, nothing after); closing the clients.
 *
 * Output: one line per check, "ok   <name>" or "FAIL <name>: <detail>", then "N passed, M failed".
 * Every pointer the library returns is released with cn_free(), so that valgrind reports no
 * definitely/indirectly lost bytes. CTEST_TIMEOUT (seconds, default 90) bounds the whole run with
 * alarm(); CTEST_SCALE (default 1) multiplies the short waits (slow runs under valgrind).
 *
 * Build: gcc -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -pedantic
 *        -I build/<goos>-<goarch> abi_check.c -L build/<goos>-<goarch> -lchannels_nats -pthread
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "channels_nats.h"

#define WHYLEN 512

/* ---- small utilities ------------------------------------------------------------------- */

static const char *g_url;
static char g_prefix[64]; /* subject prefix of this run, so parallel runs never meet */
static int g_scale = 1;
static int g_passed, g_failed;

static void sleep_ms(long ms) {
    struct timespec ts;
    ms *= g_scale;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void report(const char *name, int ok, const char *why) {
    if (ok) {
        printf("ok   %s\n", name);
        g_passed++;
    } else {
        printf("FAIL %s: %s\n", name, why[0] ? why : "(no detail)");
        g_failed++;
    }
    fflush(stdout);
}

/* Fails the current check with a formatted detail and jumps to its cleanup label "out". */
#define REQUIRE(cond, ...)                                                                    \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            snprintf(why, WHYLEN, __VA_ARGS__);                                               \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)

/* A call that must return want. */
#define EXPECT_ST(call, want)                                                                 \
    do {                                                                                      \
        cn_status st_ = (call);                                                               \
        REQUIRE(st_ == (want), "%s: got %d (%s), want %d; last_error=\"%s\"", #call, (int)st_, \
                cn_status_text(st_), (int)(want), cn_last_error());                           \
    } while (0)

/* A call that must fail with want and leave a non-empty cn_last_error(). */
#define EXPECT_FAIL(call, want)                                                               \
    do {                                                                                      \
        EXPECT_ST(call, want);                                                                \
        REQUIRE(cn_last_error() != NULL && cn_last_error()[0] != '\0',                        \
                "%s: cn_last_error() is empty after a failure", #call);                       \
    } while (0)

/* A call that must succeed and leave cn_last_error() == "". */
#define EXPECT_OK(call)                                                                       \
    do {                                                                                      \
        EXPECT_ST(call, CN_OK);                                                               \
        REQUIRE(cn_last_error() != NULL && cn_last_error()[0] == '\0',                        \
                "%s: cn_last_error() is \"%s\" after a success", #call,                       \
                cn_last_error() ? cn_last_error() : "(NULL)");                                \
    } while (0)

/* Builds the msgpack map {"type": "ctest", "text": <text>} into buf; returns its length. */
static size_t make_body(uint8_t *buf, size_t cap, const char *text) {
    size_t n = strlen(text), i = 0;
    if (n > 255 || cap < n + 20) {
        abort();
    }
    buf[i++] = 0x82;
    buf[i++] = 0xa4;
    memcpy(buf + i, "type", 4);
    i += 4;
    buf[i++] = 0xa5;
    memcpy(buf + i, "ctest", 5);
    i += 5;
    buf[i++] = 0xa4;
    memcpy(buf + i, "text", 4);
    i += 4;
    buf[i++] = 0xd9; /* str 8 */
    buf[i++] = (uint8_t)n;
    memcpy(buf + i, text, n);
    i += n;
    return i;
}

/* A message body together with its length. */
typedef struct {
    uint8_t data[320];
    size_t len;
} body_t;

static body_t body_of(const char *text) {
    body_t b;
    b.len = make_body(b.data, sizeof b.data, text);
    return b;
}

/* ---- completion recorder ---------------------------------------------------------------- */

static pthread_mutex_t g_seq_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_seq;

static long next_seq(void) {
    long s;
    pthread_mutex_lock(&g_seq_mu);
    s = ++g_seq;
    pthread_mutex_unlock(&g_seq_mu);
    return s;
}

/* What a cn_callback reported; everything is copied inside the callback. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    cn_status status;
    char text[256];
    int has_text;
    uint8_t *data; /* malloc'ed copy of the body, freed by result_destroy */
    size_t len;
    long seq; /* order of completion among all recorders */
    /* optional work done inside the callback (check_callback_rules) */
    cn_client inner_client;
    const char *inner_channel;
    cn_status inner_wait_receive, inner_wait_close, inner_wait_connect, inner_send;
    int inner_error_set;
} result_t;

/* A mutex, and a condition variable whose timed waits use CLOCK_MONOTONIC (see wait_count). */
static void sync_init(pthread_mutex_t *mu, pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_mutex_init(mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

static void result_init(result_t *r) {
    memset(r, 0, sizeof *r);
    sync_init(&r->mu, &r->cv);
    r->status = (cn_status)-1;
}

static void result_destroy(result_t *r) {
    free(r->data);
    r->data = NULL;
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
}

/* A malloc'ed copy of a callback's data (valid only during the call), or NULL for none. */
static uint8_t *copy_bytes(const uint8_t *data, size_t len) {
    uint8_t *copy;
    if (data == NULL || len == 0) {
        return NULL;
    }
    copy = malloc(len);
    if (copy == NULL) {
        abort();
    }
    memcpy(copy, data, len);
    return copy;
}

static void on_result(void *closure, cn_status status, const char *text, const uint8_t *data,
                      size_t len) {
    result_t *r = closure;
    long seq = next_seq();
    uint8_t *copy = copy_bytes(data, len);
    pthread_mutex_lock(&r->mu);
    r->calls++;
    r->status = status;
    r->seq = seq;
    if (text != NULL) {
        snprintf(r->text, sizeof r->text, "%s", text);
        r->has_text = 1;
    }
    free(r->data);
    r->data = copy;
    r->len = len;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Waits on cv until *counter (guarded by mu) is at least n or timeout_ms ran out; returns it. */
static int wait_count(pthread_mutex_t *mu, pthread_cond_t *cv, const int *counter, int n, long timeout_ms) {
    struct timespec dl;
    int calls;
    timeout_ms *= g_scale;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(mu);
    while (*counter < n) {
        if (pthread_cond_timedwait(cv, mu, &dl) == ETIMEDOUT) {
            break;
        }
    }
    calls = *counter;
    pthread_mutex_unlock(mu);
    return calls;
}

/* *counter, read under mu. */
static int read_count(pthread_mutex_t *mu, const int *counter) {
    int n;
    pthread_mutex_lock(mu);
    n = *counter;
    pthread_mutex_unlock(mu);
    return n;
}

/* Waits until the recorder has at least n calls or timeout_ms ran out; returns the call count. */
static int result_wait(result_t *r, int n, long timeout_ms) {
    return wait_count(&r->mu, &r->cv, &r->calls, n, timeout_ms);
}

static int result_calls(result_t *r) { return read_count(&r->mu, &r->calls); }

/* ---- helpers over the library ------------------------------------------------------------ */

/* A received message: a malloc'ed copy. */
typedef struct {
    uint8_t *data;
    size_t len;
} msg_t;

static void msg_free(msg_t *m) {
    free(m->data);
    m->data = NULL;
    m->len = 0;
}

static int msg_is(const msg_t *m, const body_t *b) {
    return m->data != NULL && m->len == b->len && memcmp(m->data, b->data, b->len) == 0;
}

/* Receives one message of channel within timeout_ms (pending form; cancelled on timeout).
   Returns CN_OK with *out filled, CN_TIMEOUT when nothing came, or the error. *immediate tells
   whether cn_receive finished at once (may be NULL). */
static cn_status recv_msg(cn_client c, const char *channel, long timeout_ms, msg_t *out,
                          int *immediate) {
    result_t r;
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    cn_status st;
    out->data = NULL;
    out->len = 0;
    if (immediate) {
        *immediate = 0;
    }
    result_init(&r);
    st = cn_receive(c, channel, on_result, &r, &body, &len, &op);
    if (st == CN_OK) {
        if (immediate) {
            *immediate = 1;
        }
        if (body == NULL) {
            result_destroy(&r);
            return CN_INTERNAL;
        }
        out->data = malloc(len ? len : 1);
        memcpy(out->data, body, len);
        out->len = len;
        cn_free(body);
        result_destroy(&r);
        return CN_OK;
    }
    if (st != CN_PENDING) {
        result_destroy(&r);
        return st;
    }
    if (result_wait(&r, 1, timeout_ms) == 0) {
        if (cn_cancel(c, op) == CN_OK) {
            result_destroy(&r);
            return CN_TIMEOUT;
        }
        result_wait(&r, 1, 10000); /* CN_NOT_PENDING: the callback runs or ran */
    }
    st = r.status;
    if (st == CN_OK) {
        out->data = r.data;
        out->len = r.len;
        r.data = NULL;
    }
    result_destroy(&r);
    return st;
}

/* The client configuration JSON for g_url and g_prefix. The connect timeout is generous: under
   valgrind a loopback dial can take longer than the 2 s default. */
static void config_json(char *buf, size_t n) {
    snprintf(buf, n,
             "{\"servers\": [\"%s\"], \"prefix\": \"%s\", \"release_linger\": 0.2, "
             "\"connect_options\": {\"connect_timeout\": 20}}",
             g_url, g_prefix);
}

static cn_status connect_wait(cn_client *c) {
    char cfg[512];
    config_json(cfg, sizeof cfg);
    return cn_connect(cfg, NULL, NULL, NULL, NULL, c);
}

/* new_channel in waiting form; the name is returned as a malloc'ed copy (cn_free'd here). */
static cn_status new_channel(cn_client c, char *out, size_t n) {
    char *name = NULL;
    cn_status st = cn_new_channel(c, NULL, NULL, NULL, &name, NULL);
    out[0] = '\0';
    if (st == CN_OK) {
        if (name == NULL) {
            return CN_INTERNAL;
        }
        snprintf(out, n, "%s", name);
    }
    cn_free(name);
    return st;
}

static int is_hex(const char *s, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
            return 0;
        }
    }
    return 1;
}

/* specific.<12 hex>!<32 hex> */
static int is_process_channel_name(const char *s) {
    return strlen(s) == 9 + 12 + 1 + 32 && strncmp(s, "specific.", 9) == 0 && is_hex(s + 9, 12) &&
           s[21] == '!' && is_hex(s + 22, 32);
}

/* ---- the checks ------------------------------------------------------------------------- */

static cn_client A, B; /* two connected clients shared by the checks */

static int check_version_status_text(char *why) {
    int i;
    REQUIRE(cn_version() != NULL && cn_version()[0] != '\0', "cn_version() is NULL or empty");
    for (i = CN_OK; i <= CN_INTERNAL; i++) {
        const char *t = cn_status_text((cn_status)i);
        REQUIRE(t != NULL && strncmp(t, "CN_", 3) == 0, "cn_status_text(%d) = \"%s\"", i,
                t ? t : "(NULL)");
    }
    REQUIRE(strncmp(cn_status_text(CN_CLOSED), "CN_CLOSED", 9) == 0, "cn_status_text(CN_CLOSED) = \"%s\"",
            cn_status_text(CN_CLOSED));
    REQUIRE(cn_status_text((cn_status)999) != NULL && cn_status_text((cn_status)999)[0] != '\0',
            "cn_status_text(999) is NULL or empty");
    REQUIRE(cn_status_text((cn_status)-1) != NULL, "cn_status_text(-1) is NULL");
    cn_free(NULL); /* ignored */
    return 1;
out:
    return 0;
}

static int check_connect_wait(char *why) {
    A = B = 0;
    EXPECT_OK(connect_wait(&A));
    REQUIRE(A != 0, "client handle A is 0");
    EXPECT_OK(connect_wait(&B));
    REQUIRE(B != 0 && B != A, "client handle B is 0 or equals A");
    return 1;
out:
    return 0;
}

static int check_connect_pending(char *why) {
    char cfg[512];
    cn_client c = 0;
    result_t r, nc;
    char *name = NULL;
    cn_op op = 0;
    cn_status st;
    int ok = 0;
    result_init(&r);
    result_init(&nc);
    config_json(cfg, sizeof cfg);
    EXPECT_ST(cn_connect(cfg, NULL, NULL, on_result, &r, &c), CN_PENDING);
    REQUIRE(c != 0, "the handle is not set at once with CN_PENDING");
    REQUIRE(result_wait(&r, 1, 5000) == 1, "the connect callback did not run within 5 s");
    REQUIRE(r.status == CN_OK, "connect callback status %d (%s): %s", (int)r.status,
            cn_status_text(r.status), r.text);
    /* first new_channel with a callback: at once or pending (callback gets the name as text) */
    st = cn_new_channel(c, NULL, on_result, &nc, &name, &op);
    if (st == CN_PENDING) {
        REQUIRE(op != 0, "new_channel CN_PENDING without an op handle");
        REQUIRE(result_wait(&nc, 1, 5000) == 1, "new_channel callback did not run within 5 s");
        REQUIRE(nc.status == CN_OK && nc.has_text && is_process_channel_name(nc.text),
                "new_channel callback: status %d, text \"%s\"", (int)nc.status, nc.text);
    } else {
        REQUIRE(st == CN_OK && name != NULL && is_process_channel_name(name),
                "first cn_new_channel with callback: %d (%s)", (int)st, cn_last_error());
        cn_free(name);
        name = NULL;
    }
    /* the process subscription is now confirmed: finishes at once, callback not called */
    result_destroy(&nc);
    result_init(&nc);
    EXPECT_OK(cn_new_channel(c, NULL, on_result, &nc, &name, &op));
    REQUIRE(name != NULL && is_process_channel_name(name), "second new_channel name \"%s\"",
            name ? name : "(NULL)");
    sleep_ms(50);
    REQUIRE(result_calls(&nc) == 0, "callback of a new_channel that finished at once was called");
    EXPECT_OK(cn_close(c, NULL, NULL));
    c = 0;
    ok = 1;
out:
    cn_free(name);
    if (c != 0) {
        cn_close(c, NULL, NULL);
    }
    result_destroy(&r);
    result_destroy(&nc);
    return ok;
}

static int check_connect_no_server(char *why) {
    cn_client c = 0;
    result_t r;
    int ok = 0;
    /* port 1 on loopback refuses at once; the password must not show in the error */
    static const char cfg[] = "{\"servers\": [\"nats://ctuser:s3cr3tpw@127.0.0.1:1\"], "
                              "\"connect_options\": {\"connect_timeout\": 2}}";
    result_init(&r);
    EXPECT_FAIL(cn_connect(cfg, NULL, NULL, NULL, NULL, &c), CN_NO_SERVER);
    REQUIRE(strstr(cn_last_error(), "s3cr3tpw") == NULL, "cn_last_error() shows the password: %s",
            cn_last_error());
    /* "if the connection fails, it is released and later calls return CN_CLOSED" */
    if (c != 0) {
        EXPECT_FAIL(cn_flush(c), CN_CLOSED);
    }
    /* the pending form reports it through the callback */
    c = 0;
    EXPECT_ST(cn_connect(cfg, NULL, NULL, on_result, &r, &c), CN_PENDING);
    REQUIRE(c != 0, "no handle with CN_PENDING");
    REQUIRE(result_wait(&r, 1, 5000) == 1, "the connect callback did not run within 5 s");
    REQUIRE(r.status == CN_NO_SERVER, "connect callback status %d (%s), want CN_NO_SERVER",
            (int)r.status, cn_status_text(r.status));
    REQUIRE(r.has_text && r.text[0] && strstr(r.text, "s3cr3tpw") == NULL,
            "callback error text empty or shows the password: \"%s\"", r.text);
    EXPECT_FAIL(cn_flush(c), CN_CLOSED);
    EXPECT_FAIL(cn_close(c, NULL, NULL), CN_CLOSED);
    ok = 1;
out:
    result_destroy(&r);
    return ok;
}

static int check_new_channel(char *why) {
    char *name = NULL, *name2 = NULL;
    int ok = 0;
    EXPECT_OK(cn_new_channel(A, NULL, NULL, NULL, &name, NULL));
    REQUIRE(name != NULL, "*channel is NULL after CN_OK");
    REQUIRE(is_process_channel_name(name), "name \"%s\" is not specific.<12 hex>!<32 hex>", name);
    EXPECT_OK(cn_new_channel(A, "", NULL, NULL, &name2, NULL));
    REQUIRE(name2 != NULL && is_process_channel_name(name2), "second name \"%s\"",
            name2 ? name2 : "(NULL)");
    REQUIRE(strncmp(name, name2, 22) == 0, "names of one client differ before '!': %s %s", name,
            name2);
    REQUIRE(strcmp(name, name2) != 0, "two new channels have the same name %s", name);
    cn_free(name2);
    name2 = NULL;
    EXPECT_OK(cn_new_channel(A, "custom", NULL, NULL, &name2, NULL));
    REQUIRE(name2 != NULL && strncmp(name2, "custom.", 7) == 0 && strchr(name2, '!') != NULL,
            "prefix \"custom\" gave \"%s\"", name2 ? name2 : "(NULL)");
    ok = 1;
out:
    cn_free(name);
    cn_free(name2);
    return ok;
}

static int check_send_receive_immediate(char *why) {
    char ch1[128], ch2[128];
    body_t x = body_of("immediate-x"), y = body_of("immediate-y");
    msg_t m = {NULL, 0};
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    result_t r;
    int ok = 0, immediate = 0;
    result_init(&r);
    EXPECT_OK(new_channel(A, ch1, sizeof ch1));
    EXPECT_OK(new_channel(A, ch2, sizeof ch2));
    EXPECT_OK(cn_send(B, ch1, x.data, x.len, NULL, NULL, NULL));
    EXPECT_OK(cn_send(B, ch2, y.data, y.len, on_result, &r, &op));
    /* ch1 and ch2 share A's process subscription and one dispatcher: once y arrived, x has too */
    EXPECT_ST(recv_msg(A, ch2, 5000, &m, &immediate), CN_OK);
    REQUIRE(msg_is(&m, &y), "ch2 body differs from what was sent (len %zu vs %zu)", m.len, y.len);
    msg_free(&m);
    EXPECT_OK(cn_receive(A, ch1, on_result, &r, &body, &len, &op));
    REQUIRE(body != NULL, "CN_OK without *body");
    REQUIRE(len == x.len && memcmp(body, x.data, len) == 0,
            "immediate body differs (len %zu vs %zu)", len, x.len);
    sleep_ms(50);
    REQUIRE(result_calls(&r) == 0, "a callback ran for an operation that finished at once");
    ok = 1;
out:
    cn_free(body);
    msg_free(&m);
    result_destroy(&r);
    return ok;
}

static int check_pending_receive(char *why) {
    char ch[128];
    body_t x = body_of("pending-x");
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    result_t r;
    int ok = 0;
    result_init(&r);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_ST(cn_receive(A, ch, on_result, &r, &body, &len, &op), CN_PENDING);
    REQUIRE(op != 0, "CN_PENDING without an op handle");
    sleep_ms(20);
    REQUIRE(result_calls(&r) == 0, "callback ran before anything was sent");
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL));
    REQUIRE(result_wait(&r, 1, 5000) == 1, "callback did not run within 5 s of the send");
    REQUIRE(r.status == CN_OK, "callback status %d (%s): %s", (int)r.status,
            cn_status_text(r.status), r.text);
    REQUIRE(r.len == x.len && r.data && memcmp(r.data, x.data, x.len) == 0,
            "callback body differs (len %zu vs %zu)", r.len, x.len);
    sleep_ms(50);
    REQUIRE(result_calls(&r) == 1, "callback ran %d times", result_calls(&r));
    EXPECT_FAIL(cn_cancel(A, op), CN_NOT_PENDING);
    ok = 1;
out:
    result_destroy(&r);
    return ok;
}

static int check_plain_channel_shared(char *why) {
    char plain[64], group[64];
    body_t x = body_of("plain-work");
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op opa = 0, opb = 0;
    result_t ra, rb;
    int ok = 0, got;
    result_init(&ra);
    result_init(&rb);
    snprintf(plain, sizeof plain, "work.q%ld", (long)getpid());
    snprintf(group, sizeof group, "confirm%ld", (long)getpid());
    EXPECT_ST(cn_receive(A, plain, on_result, &ra, &body, &len, &opa), CN_PENDING);
    EXPECT_ST(cn_receive(B, plain, on_result, &rb, &body, &len, &opb), CN_PENDING);
    /* A pending receive confirms its subscription in the background. A waiting group_add of the
       same plain channel returns only once that channel's subscription is confirmed (S1), so
       after it both clients are surely subscribed; the membership is discarded again. */
    EXPECT_OK(cn_group_add(A, group, plain, NULL, NULL, NULL));
    EXPECT_OK(cn_group_add(B, group, plain, NULL, NULL, NULL));
    EXPECT_OK(cn_group_discard(A, group, plain));
    EXPECT_OK(cn_group_discard(B, group, plain));
    EXPECT_OK(cn_send(A, plain, x.data, x.len, NULL, NULL, NULL));
    /* wait for the first completion, then give the other time to (wrongly) complete too */
    {
        int i;
        for (i = 0; i < 500 && result_calls(&ra) + result_calls(&rb) == 0; i++) {
            sleep_ms(10);
        }
    }
    REQUIRE(result_calls(&ra) + result_calls(&rb) >= 1, "no receive completed within 5 s");
    sleep_ms(300);
    got = result_calls(&ra) + result_calls(&rb);
    REQUIRE(got == 1, "%d receives completed for one send (A %d, B %d)", got, result_calls(&ra),
            result_calls(&rb));
    {
        result_t *done = result_calls(&ra) ? &ra : &rb;
        REQUIRE(done->status == CN_OK && done->len == x.len && done->data &&
                    memcmp(done->data, x.data, x.len) == 0,
                "completed receive: status %d, len %zu", (int)done->status, done->len);
    }
    /* the other one is still pending and can be withdrawn */
    if (result_calls(&ra)) {
        EXPECT_OK(cn_cancel(B, opb));
        opb = 0;
    } else {
        EXPECT_OK(cn_cancel(A, opa));
        opa = 0;
    }
    ok = 1;
out:
    if (!ok) { /* withdraw what may still wait, so no callback outlives the recorders */
        if (opa && cn_cancel(A, opa) != CN_OK) {
            result_wait(&ra, 1, 5000);
        }
        if (opb && cn_cancel(B, opb) != CN_OK) {
            result_wait(&rb, 1, 5000);
        }
    }
    result_destroy(&ra);
    result_destroy(&rb);
    return ok;
}

static int check_group_fanout(char *why, char *ch1, char *ch2, const char *group) {
    body_t g = body_of("group-fanout");
    msg_t m1 = {NULL, 0}, m2 = {NULL, 0};
    int ok = 0;
    EXPECT_OK(new_channel(A, ch1, 128));
    EXPECT_OK(new_channel(A, ch2, 128));
    EXPECT_OK(cn_group_add(A, group, ch1, NULL, NULL, NULL));
    EXPECT_OK(cn_group_add(A, group, ch2, NULL, NULL, NULL));
    EXPECT_OK(cn_group_add(A, group, ch2, NULL, NULL, NULL)); /* twice is not an error */
    EXPECT_OK(cn_group_send(B, group, g.data, g.len, NULL, NULL, NULL));
    EXPECT_ST(recv_msg(A, ch1, 5000, &m1, NULL), CN_OK);
    EXPECT_ST(recv_msg(A, ch2, 5000, &m2, NULL), CN_OK);
    REQUIRE(msg_is(&m1, &g), "member 1 got a different body");
    REQUIRE(msg_is(&m2, &g), "member 2 got a different body");
    /* a group without members is not an error */
    EXPECT_OK(cn_group_send(B, "nobody-here", g.data, g.len, NULL, NULL, NULL));
    ok = 1;
out:
    msg_free(&m1);
    msg_free(&m2);
    return ok;
}

static int check_group_fanout_clients(char *why) {
    /* one member in each client: the server fans the one publish out */
    char cha[128], chb[128], group[64];
    body_t g = body_of("group-two-clients");
    msg_t m1 = {NULL, 0}, m2 = {NULL, 0};
    int ok = 0;
    snprintf(group, sizeof group, "fan2c%ld", (long)getpid());
    EXPECT_OK(new_channel(A, cha, sizeof cha));
    EXPECT_OK(new_channel(B, chb, sizeof chb));
    EXPECT_OK(cn_group_add(A, group, cha, NULL, NULL, NULL));
    EXPECT_OK(cn_group_add(B, group, chb, NULL, NULL, NULL));
    EXPECT_OK(cn_group_send(A, group, g.data, g.len, NULL, NULL, NULL));
    EXPECT_ST(recv_msg(A, cha, 5000, &m1, NULL), CN_OK);
    EXPECT_ST(recv_msg(B, chb, 5000, &m2, NULL), CN_OK);
    REQUIRE(msg_is(&m1, &g) && msg_is(&m2, &g), "a member got a different body");
    EXPECT_OK(cn_group_discard(A, group, cha));
    EXPECT_OK(cn_group_discard(B, group, chb));
    ok = 1;
out:
    msg_free(&m1);
    msg_free(&m2);
    return ok;
}

static int check_group_discard(char *why, const char *ch1, const char *ch2, const char *group) {
    body_t g = body_of("group-after-discard"), mark = body_of("marker-after-group");
    msg_t m1 = {NULL, 0}, m2 = {NULL, 0};
    int ok = 0;
    REQUIRE(ch1[0] && ch2[0], "needs the channels of group_fanout");
    EXPECT_OK(cn_group_discard(A, group, ch2));
    EXPECT_OK(cn_group_discard(A, group, ch2)); /* a non-member: not an error */
    EXPECT_OK(cn_group_send(B, group, g.data, g.len, NULL, NULL, NULL));
    /* Sent after the group message by the same connection: if ch2 were still a member, the group
       message would be first in ch2's mailbox (S10). */
    EXPECT_OK(cn_send(B, ch2, mark.data, mark.len, NULL, NULL, NULL));
    EXPECT_ST(recv_msg(A, ch1, 5000, &m1, NULL), CN_OK);
    REQUIRE(msg_is(&m1, &g), "the remaining member did not get the group message");
    EXPECT_ST(recv_msg(A, ch2, 5000, &m2, NULL), CN_OK);
    REQUIRE(msg_is(&m2, &mark), "the discarded member still got the group message");
    msg_free(&m2);
    EXPECT_ST(recv_msg(A, ch2, 200, &m2, NULL), CN_TIMEOUT);
    ok = 1;
out:
    msg_free(&m1);
    msg_free(&m2);
    return ok;
}

static int check_cancel_before_delivery(char *why) {
    char ch[128];
    body_t x = body_of("cancelled-receive-keeps-this");
    msg_t m = {NULL, 0};
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    result_t r;
    int ok = 0;
    result_init(&r);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_ST(cn_receive(A, ch, on_result, &r, &body, &len, &op), CN_PENDING);
    REQUIRE(op != 0, "CN_PENDING without an op handle");
    EXPECT_OK(cn_cancel(A, op));
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL));
    EXPECT_ST(recv_msg(A, ch, 5000, &m, NULL), CN_OK);
    REQUIRE(msg_is(&m, &x), "the later receive got a different body");
    sleep_ms(100);
    REQUIRE(result_calls(&r) == 0, "the cancelled receive's callback ran (status %d)",
            (int)r.status);
    EXPECT_FAIL(cn_cancel(A, 0), CN_INVALID_HANDLE);
    ok = 1;
out:
    msg_free(&m);
    result_destroy(&r);
    return ok;
}

static int check_put_back(char *why) {
    char ch[128];
    body_t x = body_of("put-back-x"), y = body_of("put-back-y");
    msg_t m = {NULL, 0};
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    result_t r;
    int ok = 0, immediate = 0;
    result_init(&r);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL));
    EXPECT_OK(cn_send(B, ch, y.data, y.len, NULL, NULL, NULL));
    EXPECT_ST(recv_msg(A, ch, 5000, &m, NULL), CN_OK);
    REQUIRE(msg_is(&m, &x), "first receive is not x");
    /* x goes back to the front of the mailbox: the next receive gets it at once, then y */
    msg_free(&m);
    EXPECT_OK(cn_put_back(A, ch, x.data, x.len));
    EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
    REQUIRE(immediate, "a receive after cn_put_back did not finish at once");
    REQUIRE(msg_is(&m, &x), "the receive after cn_put_back did not get x");
    msg_free(&m);
    EXPECT_ST(recv_msg(A, ch, 5000, &m, NULL), CN_OK);
    REQUIRE(msg_is(&m, &y), "y did not follow the put-back x");
    msg_free(&m);
    /* put_back with a waiting receive hands the message to it */
    EXPECT_ST(cn_receive(A, ch, on_result, &r, &body, &len, &op), CN_PENDING);
    EXPECT_OK(cn_put_back(A, ch, y.data, y.len));
    REQUIRE(result_wait(&r, 1, 5000) == 1, "the waiting receive did not get the put-back message");
    REQUIRE(r.status == CN_OK && r.len == y.len && r.data && memcmp(r.data, y.data, y.len) == 0,
            "waiting receive got status %d len %zu", (int)r.status, r.len);
    EXPECT_FAIL(cn_put_back(A, "bad name", y.data, y.len), CN_INVALID_NAME);
    EXPECT_FAIL(cn_put_back(A, ch, NULL, 3), CN_INVALID_ARG);
    ok = 1;
out:
    msg_free(&m);
    result_destroy(&r);
    return ok;
}

/* ---- receive buffers: cn_receive_many, cn_put_back_many ---------------------------------- */

/* The block format of cn_receive_many: records of uint32 body length, uint32 milliseconds left
   (both little-endian), then the body. */
#define RECORD_HEADER 8

static uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* One record of a block: pointers into the block. */
typedef struct {
    const uint8_t *body;
    uint32_t len;
    uint32_t left_ms;
} record_t;

/* Splits a block of len bytes into exactly count records (at most cap). Returns 1 when the block
   holds count whole records and nothing else, 0 otherwise (with the reason in why). */
static int parse_block(const uint8_t *block, size_t len, size_t count, record_t *recs, size_t cap,
                       char *why) {
    size_t at = 0, n = 0;
    while (at < len) {
        uint32_t size;
        if (len - at < RECORD_HEADER) {
            snprintf(why, WHYLEN, "block of %zu bytes ends inside the header of record %zu", len,
                     n);
            return 0;
        }
        size = get_le32(block + at);
        if (len - at - RECORD_HEADER < size) {
            snprintf(why, WHYLEN, "block of %zu bytes ends inside the body of record %zu (%u B)",
                     len, n, (unsigned)size);
            return 0;
        }
        if (n == cap) {
            snprintf(why, WHYLEN, "block holds more than %zu records", cap);
            return 0;
        }
        recs[n].len = size;
        recs[n].left_ms = get_le32(block + at + 4);
        recs[n].body = block + at + RECORD_HEADER;
        n++;
        at += RECORD_HEADER + size;
    }
    if (n != count) {
        snprintf(why, WHYLEN, "block holds %zu records, *count says %zu", n, count);
        return 0;
    }
    return 1;
}

static int record_is(const record_t *r, const body_t *b) {
    return r->len == b->len && memcmp(r->body, b->data, b->len) == 0;
}

/* A number of cn_stats(c), e.g. "\"expired\":" (key with its quotes and colon); -1 if missing. */
static long stats_number(cn_client c, const char *key) {
    char *json = NULL;
    const char *p;
    long v = -1;
    if (cn_stats(c, &json) != CN_OK || json == NULL) {
        return -1;
    }
    if ((p = strstr(json, key)) != NULL) {
        v = strtol(p + strlen(key), NULL, 10);
    }
    cn_free(json);
    return v;
}

/* B sends the bodies to ch, then a marker to mark that A receives: A's process channels share one
   subscription and one dispatcher, so once the marker arrived, every body is in ch's mailbox. */
static cn_status send_and_settle(const char *ch, const char *mark, const body_t *bodies, int n) {
    body_t marker = body_of("many-marker");
    msg_t m = {NULL, 0};
    cn_status st;
    int i;
    for (i = 0; i < n; i++) {
        if ((st = cn_send(B, ch, bodies[i].data, bodies[i].len, NULL, NULL, NULL)) != CN_OK) {
            return st;
        }
    }
    if ((st = cn_send(B, mark, marker.data, marker.len, NULL, NULL, NULL)) != CN_OK) {
        return st;
    }
    st = recv_msg(A, mark, 5000, &m, NULL);
    if (st == CN_OK && !msg_is(&m, &marker)) {
        st = CN_INTERNAL;
    }
    msg_free(&m);
    return st;
}

/* Takes several, parses the records, puts them back, receives them again in order. */
static int check_receive_many(char *why) {
    char ch[128], mark[128], theirs[128];
    body_t bodies[4];
    record_t recs[8];
    msg_t m = {NULL, 0};
    uint8_t *block = NULL, *none;
    size_t len = 0, count = 0, want_len = 0, zero = 0;
    int ok = 0, i, immediate = 0;
    char text[32];
    for (i = 0; i < 4; i++) {
        snprintf(text, sizeof text, "many-%d", i);
        bodies[i] = body_of(text);
    }
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(A, mark, sizeof mark));
    EXPECT_OK(new_channel(B, theirs, sizeof theirs));

    /* nothing waiting: CN_OK, count 0, block NULL (the garbage in the out-parameters replaced) */
    none = (uint8_t *)&zero;
    len = count = 12345;
    EXPECT_OK(cn_receive_many(A, ch, 8, &none, &len, &count));
    REQUIRE(none == NULL && len == 0 && count == 0,
            "empty mailbox: block %p len %zu count %zu, want NULL 0 0", (void *)none, len, count);

    EXPECT_OK(send_and_settle(ch, mark, bodies, 4));
    /* max 0 takes none */
    none = (uint8_t *)&zero;
    EXPECT_OK(cn_receive_many(A, ch, 0, &none, &len, &count));
    REQUIRE(none == NULL && count == 0, "max 0: block %p count %zu", (void *)none, count);

    /* 4 waiting, max 3: the 3 oldest, in order, each 8 + body bytes, time left within the expiry
       (the default, 60 s) */
    EXPECT_OK(cn_receive_many(A, ch, 3, &block, &len, &count));
    REQUIRE(count == 3 && block != NULL, "took count %zu block %p, want 3 records", count,
            (void *)block);
    for (i = 0; i < 3; i++) {
        want_len += RECORD_HEADER + bodies[i].len;
    }
    REQUIRE(len == want_len, "block is %zu bytes, want %zu", len, want_len);
    if (!parse_block(block, len, count, recs, 8, why)) {
        goto out;
    }
    for (i = 0; i < 3; i++) {
        REQUIRE(record_is(&recs[i], &bodies[i]), "record %d is not many-%d (len %u)", i, i,
                (unsigned)recs[i].len);
        REQUIRE(recs[i].left_ms <= 60000 && recs[i].left_ms > 30000,
                "record %d: %u ms left, want at most the expiry of 60000", i,
                (unsigned)recs[i].left_ms);
    }

    /* back to the front of the mailbox, unchanged; the library copies the block */
    EXPECT_OK(cn_put_back_many(A, ch, block, len));
    memset(block, 0xc1, len);
    cn_free(block);
    block = NULL;
    for (i = 0; i < 4; i++) {
        EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
        REQUIRE(immediate, "receive %d after cn_put_back_many did not finish at once", i);
        REQUIRE(msg_is(&m, &bodies[i]), "receive %d after cn_put_back_many is not many-%d", i, i);
        msg_free(&m);
    }
    none = (uint8_t *)&zero;
    EXPECT_OK(cn_receive_many(A, ch, 8, &none, &len, &count));
    REQUIRE(none == NULL && count == 0, "after receiving everything: count %zu", count);

    EXPECT_FAIL(cn_receive_many(A, ch, 3, NULL, &len, &count), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive_many(A, ch, 3, &block, NULL, &count), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive_many(A, ch, 3, &block, &len, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive_many(A, NULL, 3, &block, &len, &count), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive_many(A, "bad name", 3, &block, &len, &count), CN_INVALID_NAME);
    EXPECT_FAIL(cn_receive_many(A, theirs, 3, &block, &len, &count), CN_FOREIGN_CHANNEL);
    EXPECT_FAIL(cn_receive_many(0, ch, 3, &block, &len, &count), CN_INVALID_HANDLE);
    REQUIRE(block == NULL, "a refused cn_receive_many returned a block");
    ok = 1;
out:
    cn_free(block);
    msg_free(&m);
    return ok;
}

/* cn_put_back_many: malformed blocks refused whole, a waiting receive gets the first message,
   0 ms left expires. */
static int check_put_back_many(char *why) {
    char ch[128], mark[128];
    body_t bodies[3], later[2];
    record_t recs[8];
    msg_t m = {NULL, 0};
    uint8_t *block = NULL, *bad = NULL, *body = NULL;
    size_t len = 0, count = 0, blen = 0;
    cn_op op = 0;
    result_t r;
    long expired;
    int ok = 0, i, immediate = 0;
    char text[32];
    result_init(&r);
    for (i = 0; i < 3; i++) {
        snprintf(text, sizeof text, "back-%d", i);
        bodies[i] = body_of(text);
    }
    for (i = 0; i < 2; i++) {
        snprintf(text, sizeof text, "expire-%d", i);
        later[i] = body_of(text);
    }
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(A, mark, sizeof mark));
    EXPECT_OK(send_and_settle(ch, mark, bodies, 3));
    EXPECT_OK(cn_receive_many(A, ch, 8, &block, &len, &count));
    REQUIRE(count == 3 && block != NULL, "took %zu, want 3", count);
    if (!parse_block(block, len, count, recs, 8, why)) {
        goto out;
    }

    /* a block that ends inside a record is refused whole: nothing of it goes back */
    EXPECT_FAIL(cn_put_back_many(A, ch, block, 5), CN_INVALID_ARG);
    EXPECT_FAIL(cn_put_back_many(A, ch, block, RECORD_HEADER), CN_INVALID_ARG);
    EXPECT_FAIL(cn_put_back_many(A, ch, block, len - 1), CN_INVALID_ARG);
    bad = malloc(len);
    REQUIRE(bad != NULL, "malloc");
    memcpy(bad, block, len);
    put_le32(bad + RECORD_HEADER + recs[0].len, recs[1].len + 1000); /* the second's length */
    EXPECT_FAIL(cn_put_back_many(A, ch, bad, len), CN_INVALID_ARG);
    EXPECT_FAIL(cn_put_back_many(A, ch, NULL, len), CN_INVALID_ARG);
    EXPECT_FAIL(cn_put_back_many(A, "bad name", block, len), CN_INVALID_NAME);
    EXPECT_FAIL(cn_put_back_many(0, ch, block, len), CN_INVALID_HANDLE);
    EXPECT_OK(cn_put_back_many(A, ch, block, 0)); /* len 0: nothing */
    EXPECT_OK(cn_receive_many(A, ch, 8, &body, &blen, &count));
    REQUIRE(count == 0 && body == NULL, "refused put-backs left %zu message(s) in the mailbox",
            count);

    /* with a receive waiting, the first message completes it, the rest stay in order */
    EXPECT_ST(cn_receive(A, ch, on_result, &r, &body, &blen, &op), CN_PENDING);
    EXPECT_OK(cn_put_back_many(A, ch, block, len));
    cn_free(block);
    block = NULL;
    REQUIRE(result_wait(&r, 1, 5000) == 1, "the waiting receive did not get a put-back message");
    REQUIRE(r.status == CN_OK && r.len == bodies[0].len && r.data != NULL &&
                memcmp(r.data, bodies[0].data, r.len) == 0,
            "the waiting receive got status %d len %zu, want back-0", (int)r.status, r.len);
    for (i = 1; i < 3; i++) {
        EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
        REQUIRE(immediate && msg_is(&m, &bodies[i]), "then not back-%d at once", i);
        msg_free(&m);
    }

    /* 0 ms left: expired, dropped (and counted) by the next receive */
    EXPECT_OK(send_and_settle(ch, mark, later, 2));
    EXPECT_OK(cn_receive_many(A, ch, 8, &block, &len, &count));
    REQUIRE(count == 2 && block != NULL, "took %zu, want 2", count);
    if (!parse_block(block, len, count, recs, 8, why)) {
        goto out;
    }
    REQUIRE(record_is(&recs[0], &later[0]) && record_is(&recs[1], &later[1]),
            "took other messages than expire-0 and expire-1");
    put_le32(block + 4, 0);
    put_le32(block + RECORD_HEADER + recs[0].len + 4, 0);
    expired = stats_number(A, "\"expired\":");
    REQUIRE(expired >= 0, "no \"expired\" in cn_stats");
    EXPECT_OK(cn_put_back_many(A, ch, block, len));
    EXPECT_ST(recv_msg(A, ch, 200, &m, NULL), CN_TIMEOUT);
    REQUIRE(stats_number(A, "\"expired\":") >= expired + 2,
            "dropped.expired went from %ld to %ld, want 2 more", expired,
            stats_number(A, "\"expired\":"));
    ok = 1;
out:
    cn_free(block);
    cn_free(body);
    free(bad);
    msg_free(&m);
    result_destroy(&r);
    return ok;
}

/* ---- streams: cn_receive_stream, cn_stream_stop ------------------------------------------ */

#define STREAM_MAX 16

/* One result of a stream, copied inside the callback. */
typedef struct {
    cn_status status;
    int has_text;
    char text[128];
    uint8_t *data; /* malloc'ed copy, freed by stream_rec_destroy */
    size_t len;
} stream_item_t;

/* Every call of a stream's callback (the first STREAM_MAX kept). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    stream_item_t items[STREAM_MAX];
} stream_rec_t;

static void stream_rec_init(stream_rec_t *s) {
    memset(s, 0, sizeof *s);
    sync_init(&s->mu, &s->cv);
}

static void stream_rec_destroy(stream_rec_t *s) {
    int i;
    for (i = 0; i < STREAM_MAX; i++) {
        free(s->items[i].data);
        s->items[i].data = NULL;
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

static void on_stream(void *closure, cn_status status, const char *text, const uint8_t *data,
                      size_t len) {
    stream_rec_t *s = closure;
    uint8_t *copy = copy_bytes(data, len);
    pthread_mutex_lock(&s->mu);
    if (s->calls < STREAM_MAX) {
        stream_item_t *it = &s->items[s->calls];
        it->status = status;
        it->has_text = text != NULL;
        if (text != NULL) {
            snprintf(it->text, sizeof it->text, "%s", text);
        }
        it->data = copy;
        it->len = len;
        copy = NULL;
    }
    s->calls++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(copy);
}

/* Waits until the stream had at least n results or timeout_ms ran out; returns the count. */
static int stream_wait(stream_rec_t *s, int n, long timeout_ms) {
    return wait_count(&s->mu, &s->cv, &s->calls, n, timeout_ms);
}

static int stream_calls(stream_rec_t *s) { return read_count(&s->mu, &s->calls); }

/* Result i is CN_OK with body b and text NULL (a message that arrived just now). */
static int stream_item_is(stream_rec_t *s, int i, const body_t *b) {
    int ok;
    pthread_mutex_lock(&s->mu);
    ok = i < s->calls && i < STREAM_MAX && s->items[i].status == CN_OK && !s->items[i].has_text &&
         s->items[i].data != NULL && s->items[i].len == b->len &&
         memcmp(s->items[i].data, b->data, b->len) == 0;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Cleanup of a check that failed with a stream still running: stops it and waits for the results
   of the credit it used, so that no callback outlives the recorder. */
static void stream_abandon(cn_client c, cn_op op, stream_rec_t *s, uint32_t credit) {
    uint32_t unused = 0;
    if (op != 0 && cn_stream_stop(c, op, &unused) == CN_OK) {
        stream_wait(s, (int)(credit - unused), 5000);
    }
}

/* A stream of credit 3: two messages come as two callbacks (CN_OK, text NULL, the bodies in
   order); cn_stream_stop says CN_OK with 1 unused, then CN_NOT_PENDING; the next message stays in
   the mailbox. Refused arguments, and the op of a pending receive is not a stream. */
static int check_stream(char *why) {
    char ch[128], mark[128], plain[64];
    body_t bodies[3];
    msg_t m = {NULL, 0};
    stream_rec_t s;
    result_t r;
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 77, rop = 0;
    uint32_t unused = 77;
    int ok = 0, i, immediate = 0;
    char text[32];
    stream_rec_init(&s);
    result_init(&r);
    for (i = 0; i < 3; i++) {
        snprintf(text, sizeof text, "stream-%d", i);
        bodies[i] = body_of(text);
    }
    snprintf(plain, sizeof plain, "streamplain%ld", (long)getpid());
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(A, mark, sizeof mark));

    EXPECT_FAIL(cn_receive_stream(A, ch, 3, NULL, &s, &op), CN_INVALID_ARG);
    REQUIRE(op == 0, "a refused cn_receive_stream left *op = %llu", (unsigned long long)op);
    EXPECT_FAIL(cn_receive_stream(A, ch, 0, on_stream, &s, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive_stream(A, "bad name", 3, on_stream, &s, &op), CN_INVALID_NAME);
    EXPECT_FAIL(cn_receive_stream(0, ch, 3, on_stream, &s, &op), CN_INVALID_HANDLE);
    /* a plain channel never received on: its subscription is not ready */
    EXPECT_FAIL(cn_receive_stream(A, plain, 3, on_stream, &s, &op), CN_ILLEGAL_STATE);
    EXPECT_FAIL(cn_stream_stop(A, 1, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_stream_stop(A, 0, &unused), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_stream_stop(A, (cn_op)1 << 60, &unused), CN_INVALID_HANDLE);
    REQUIRE(unused == 0, "a refused cn_stream_stop left *unused = %u", (unsigned)unused);

    op = 77;
    EXPECT_ST(cn_receive_stream(A, ch, 3, on_stream, &s, &op), CN_PENDING);
    REQUIRE(op != 0 && op != 77, "CN_PENDING with op %llu", (unsigned long long)op);
    REQUIRE(cn_last_error()[0] == '\0', "cn_last_error() is \"%s\" after CN_PENDING",
            cn_last_error());
    EXPECT_OK(cn_send(B, ch, bodies[0].data, bodies[0].len, NULL, NULL, NULL));
    EXPECT_OK(cn_send(B, ch, bodies[1].data, bodies[1].len, NULL, NULL, NULL));
    REQUIRE(stream_wait(&s, 2, 5000) >= 2, "%d of 2 stream results within 5 s", stream_calls(&s));
    for (i = 0; i < 2; i++) {
        REQUIRE(stream_item_is(&s, i, &bodies[i]),
                "result %d: status %d text %s len %zu, want CN_OK, NULL and stream-%d", i,
                (int)s.items[i].status, s.items[i].has_text ? s.items[i].text : "NULL",
                s.items[i].len, i);
    }
    unused = 77;
    EXPECT_OK(cn_stream_stop(A, op, &unused));
    REQUIRE(unused == 1, "cn_stream_stop after 2 of 3: unused %u, want 1", (unsigned)unused);
    unused = 77;
    EXPECT_FAIL(cn_stream_stop(A, op, &unused), CN_NOT_PENDING);
    REQUIRE(unused == 0, "CN_NOT_PENDING with unused %u, want 0", (unsigned)unused);
    EXPECT_FAIL(cn_cancel(A, op), CN_NOT_PENDING);
    op = 0;

    /* the stream has ended: the next message stays in the mailbox */
    EXPECT_OK(send_and_settle(ch, mark, &bodies[2], 1));
    EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
    REQUIRE(immediate && msg_is(&m, &bodies[2]), "the message after the stop is not waiting");
    REQUIRE(stream_calls(&s) == 2, "the stopped stream had %d results, want 2", stream_calls(&s));

    /* the op of a pending receive is not a stream; the receive goes on waiting */
    EXPECT_ST(cn_receive(A, ch, on_result, &r, &body, &len, &rop), CN_PENDING);
    EXPECT_FAIL(cn_stream_stop(A, rop, &unused), CN_INVALID_ARG);
    EXPECT_OK(cn_cancel(A, rop));
    rop = 0;
    ok = 1;
out:
    stream_abandon(A, op, &s, 3);
    if (rop != 0 && cn_cancel(A, rop) != CN_OK) {
        result_wait(&r, 1, 5000);
    }
    msg_free(&m);
    cn_free(body);
    stream_rec_destroy(&s);
    result_destroy(&r);
    return ok;
}

/* Messages waiting: cn_receive_stream returns CN_OK, starts nothing and takes nothing; once they
   are taken it starts, and cn_cancel stops it. */
static int check_stream_messages_waiting(char *why) {
    char ch[128], mark[128];
    body_t bodies[2];
    record_t recs[4];
    stream_rec_t s;
    uint8_t *block = NULL;
    size_t len = 0, count = 0;
    cn_op op = 77;
    uint32_t unused = 77;
    int ok = 0, i;
    stream_rec_init(&s);
    bodies[0] = body_of("stream-waiting-0");
    bodies[1] = body_of("stream-waiting-1");
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(A, mark, sizeof mark));
    EXPECT_OK(send_and_settle(ch, mark, bodies, 2));

    EXPECT_OK(cn_receive_stream(A, ch, 4, on_stream, &s, &op));
    REQUIRE(op == 0, "CN_OK (nothing started) with *op = %llu, want 0", (unsigned long long)op);
    EXPECT_OK(cn_receive_many(A, ch, 8, &block, &len, &count));
    REQUIRE(count == 2 && block != NULL, "took %zu messages, want the 2 waiting", count);
    if (!parse_block(block, len, count, recs, 4, why)) {
        goto out;
    }
    for (i = 0; i < 2; i++) {
        REQUIRE(record_is(&recs[i], &bodies[i]), "record %d is not stream-waiting-%d", i, i);
    }

    EXPECT_ST(cn_receive_stream(A, ch, 4, on_stream, &s, &op), CN_PENDING);
    REQUIRE(op != 0, "CN_PENDING with op 0");
    EXPECT_OK(cn_cancel(A, op));
    EXPECT_FAIL(cn_stream_stop(A, op, &unused), CN_NOT_PENDING);
    op = 0;
    sleep_ms(50);
    REQUIRE(stream_calls(&s) == 0, "%d results of streams that never got a message",
            stream_calls(&s));
    ok = 1;
out:
    stream_abandon(A, op, &s, 4);
    cn_free(block);
    stream_rec_destroy(&s);
    return ok;
}

/* Closing the client ends an active stream with one CN_CLOSED call (a detail, no data), after
   its message; a stream whose credit was used gets none. Afterwards both calls say CN_CLOSED. */
static int check_stream_closed(char *why) {
    char ch[128], ch2[128];
    body_t x = body_of("stream-before-close"), y = body_of("stream-credit-used");
    stream_rec_t s, s2;
    cn_client c = 0;
    cn_op op = 0, op2 = 0;
    uint32_t unused = 77;
    int ok = 0;
    stream_rec_init(&s);
    stream_rec_init(&s2);
    EXPECT_OK(connect_wait(&c));
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    EXPECT_OK(new_channel(c, ch2, sizeof ch2));
    EXPECT_ST(cn_receive_stream(c, ch, 4, on_stream, &s, &op), CN_PENDING);
    EXPECT_ST(cn_receive_stream(c, ch2, 1, on_stream, &s2, &op2), CN_PENDING);
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL));
    EXPECT_OK(cn_send(B, ch2, y.data, y.len, NULL, NULL, NULL));
    REQUIRE(stream_wait(&s, 1, 5000) >= 1, "the stream got nothing within 5 s");
    REQUIRE(stream_wait(&s2, 1, 5000) >= 1, "the stream of credit 1 got nothing within 5 s");
    EXPECT_OK(cn_close(c, NULL, NULL));
    REQUIRE(stream_calls(&s) == 2, "the active stream had %d calls when cn_close returned, want 2",
            stream_calls(&s));
    REQUIRE(stream_item_is(&s, 0, &x), "its first call is not the message");
    REQUIRE(s.items[1].status == CN_CLOSED && s.items[1].has_text && s.items[1].text[0] &&
                s.items[1].data == NULL && s.items[1].len == 0,
            "its last call: status %d text %s len %zu, want CN_CLOSED with a detail, no data",
            (int)s.items[1].status, s.items[1].has_text ? s.items[1].text : "NULL",
            s.items[1].len);
    REQUIRE(stream_calls(&s2) == 1 && stream_item_is(&s2, 0, &y),
            "the stream whose credit was used had %d calls, want its message only",
            stream_calls(&s2));
    EXPECT_FAIL(cn_stream_stop(c, op, &unused), CN_CLOSED);
    EXPECT_FAIL(cn_receive_stream(c, ch, 1, on_stream, &s, &op), CN_CLOSED);
    c = 0;
    sleep_ms(50);
    REQUIRE(stream_calls(&s) == 2 && stream_calls(&s2) == 1, "calls after the close");
    ok = 1;
out:
    if (c != 0) {
        cn_close(c, NULL, NULL); /* ends the streams before the recorders go away */
    }
    stream_rec_destroy(&s);
    stream_rec_destroy(&s2);
    return ok;
}

static int check_stats(char *why) {
    char *json = NULL;
    int ok = 0;
    EXPECT_OK(cn_stats(A, &json));
    REQUIRE(json != NULL, "CN_OK without *json");
    REQUIRE(json[0] == '{', "stats is not a JSON object: %.80s", json);
    REQUIRE(strstr(json, "\"published\"") != NULL, "no \"published\" in %.200s", json);
    REQUIRE(strstr(json, "\"delivered\"") != NULL, "no \"delivered\" in %.200s", json);
    REQUIRE(strstr(json, "\"client_id\"") != NULL, "no \"client_id\" in %.200s", json);
    cn_free(json);
    json = NULL;
    /* B published every test message so far */
    EXPECT_OK(cn_stats(B, &json));
    REQUIRE(strstr(json, "\"published\":0,") == NULL, "B published nothing? %.200s", json);
    ok = 1;
out:
    cn_free(json);
    return ok;
}

static int check_flush(char *why) {
    char ch[128], ch2[128], group[64], *json = NULL;
    body_t old = body_of("queued-before-flush"), x = body_of("after-flush"),
           mark = body_of("marker-before-flush"), mark2 = body_of("marker-after-flush"),
           g = body_of("group-after-flush");
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    cn_client c = 0;
    result_t r, r2;
    int ok = 0;
    result_init(&r);
    result_init(&r2);
    snprintf(group, sizeof group, "flushgrp%ld", (long)getpid());
    EXPECT_OK(connect_wait(&c)); /* a client of its own: flush resets all its state */
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    EXPECT_OK(new_channel(c, ch2, sizeof ch2));
    EXPECT_OK(cn_group_add(c, group, ch2, NULL, NULL, NULL));
    /* old is queued in ch2's mailbox once the marker sent after it reached ch (S10) */
    EXPECT_ST(cn_receive(c, ch, on_result, &r, &body, &len, &op), CN_PENDING);
    EXPECT_OK(cn_send(B, ch2, old.data, old.len, NULL, NULL, NULL));
    EXPECT_OK(cn_send(B, ch, mark.data, mark.len, NULL, NULL, NULL));
    REQUIRE(result_wait(&r, 1, 5000) == 1, "pending receive did not get the marker");
    result_destroy(&r);
    result_init(&r);
    EXPECT_ST(cn_receive(c, ch, on_result, &r, &body, &len, &op), CN_PENDING);

    EXPECT_OK(cn_flush(c));

    EXPECT_OK(cn_stats(c, &json));
    REQUIRE(json && strstr(json, "\"groups\":0") != NULL, "groups left after flush: %.300s",
            json ? json : "(NULL)");
    /* the receive waiting across the flush keeps waiting and gets what is sent now */
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL));
    REQUIRE(result_wait(&r, 1, 5000) == 1, "the receive waiting across flush got nothing");
    REQUIRE(r.status == CN_OK && r.len == x.len && r.data && memcmp(r.data, x.data, x.len) == 0,
            "receive across flush: status %d", (int)r.status);
    /* the queued message is gone, and so is the membership */
    EXPECT_ST(cn_receive(c, ch2, on_result, &r2, &body, &len, &op), CN_PENDING);
    EXPECT_OK(cn_group_send(B, group, g.data, g.len, NULL, NULL, NULL));
    EXPECT_OK(cn_send(B, ch2, mark2.data, mark2.len, NULL, NULL, NULL));
    REQUIRE(result_wait(&r2, 1, 5000) == 1, "receive on ch2 after flush got nothing");
    REQUIRE(r2.status == CN_OK && r2.len == mark2.len && r2.data &&
                memcmp(r2.data, mark2.data, mark2.len) == 0,
            "after flush ch2 got \"%.*s\" before the marker (status %d)",
            (int)(r2.len > 60 ? 60 : r2.len), r2.data ? (const char *)r2.data : "", (int)r2.status);
    EXPECT_OK(cn_flush(c));
    EXPECT_OK(cn_close(c, NULL, NULL));
    c = 0;
    ok = 1;
out:
    cn_free(json);
    if (c != 0) {
        cn_close(c, NULL, NULL); /* ends a receive still waiting before r goes away */
    }
    result_destroy(&r);
    result_destroy(&r2);
    return ok;
}

static void *thread_last_error(void *arg) {
    const char **out = arg;
    *out = cn_last_error();
    return NULL;
}

static result_t g_sink; /* closure of calls that must fail; outlives every client */

static int check_errors(char *why) {
    char ch[128], chb[128], cfg[512], *name = NULL, *json = NULL;
    body_t x = body_of("errors");
    uint8_t *body = NULL, *big = NULL;
    size_t len = 0;
    cn_client c = 0;
    cn_op op = 0;
    int ok = 0;
    /* msgpack bodies that are not Channels messages */
    static const uint8_t array_body[] = {0x91, 0x01};                      /* [1] */
    static const uint8_t int_key_body[] = {0x81, 0x01, 0x02};              /* {1: 2} */
    static const uint8_t trailing_body[] = {0x80, 0x00};                   /* {} then a byte */
    static const uint8_t truncated_body[] = {0x81, 0xa1};                  /* {"<cut>" */
    static const uint8_t reserved_body[] = {0x81, 0xb0, '_', '_', 'a', 's', 'g', 'i', '_', 'c',
                                            'h', 'a', 'n', 'n', 'e', 'l', '_', '_', 0xa1, 'x'};
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(B, chb, sizeof chb));

    /* NULL arguments */
    EXPECT_FAIL(cn_connect(NULL, NULL, NULL, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_send(A, NULL, x.data, x.len, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_send(A, ch, NULL, x.len, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_send(A, NULL, x.data, x.len, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, ch, on_result, &g_sink, NULL, &len, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, ch, on_result, &g_sink, &body, NULL, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, NULL, on_result, &g_sink, &body, &len, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_new_channel(A, NULL, NULL, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_add(A, NULL, ch, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_add(A, "g", NULL, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_discard(A, NULL, ch), CN_INVALID_ARG);
    EXPECT_FAIL(cn_put_back(A, NULL, x.data, x.len), CN_INVALID_ARG);
    EXPECT_FAIL(cn_stats(A, NULL), CN_INVALID_ARG);

    /* cn_last_error(): "" after a success, per thread */
    EXPECT_OK(cn_stats(A, &json));
    cn_free(json);
    json = NULL;
    EXPECT_FAIL(cn_stats(A, NULL), CN_INVALID_ARG);
    {
        pthread_t t;
        const char *other = NULL;
        pthread_create(&t, NULL, thread_last_error, (void *)&other);
        pthread_join(t, NULL);
        REQUIRE(other != NULL && other[0] == '\0', "another thread sees last error \"%s\"",
                other ? other : "(NULL)");
        REQUIRE(cn_last_error()[0] != '\0', "this thread's last error vanished");
    }
    EXPECT_OK(cn_flush(B));

    /* invalid UTF-8 */
    EXPECT_FAIL(cn_send(A, "specific.\xff\xfe", x.data, x.len, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_send(A, "gr\xc3", x.data, x.len, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_new_channel(A, "\xed\xa0\x80", NULL, NULL, &name, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_connect("{\"prefix\": \"\xff\"}", NULL, NULL, NULL, NULL, &c), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, "work.\xc0\xaf", on_result, &g_sink, &body, &len, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_add(A, "g\xff", ch, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_discard(A, "g", "ch\x80"), CN_INVALID_ARG);
    EXPECT_FAIL(cn_put_back(A, "ch\xfe", x.data, x.len), CN_INVALID_ARG);

    /* bad names */
    EXPECT_FAIL(cn_send(A, "bad name", x.data, x.len, NULL, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_send(A, "", x.data, x.len, NULL, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_send(A, "a..b", x.data, x.len, NULL, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_group_send(A, "bad*group", x.data, x.len, NULL, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_group_add(A, "g>", ch, NULL, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_group_discard(A, "ok", "bad name"), CN_INVALID_NAME);
    EXPECT_FAIL(cn_receive(A, "bad name", on_result, &g_sink, &body, &len, &op), CN_INVALID_NAME);
    EXPECT_FAIL(cn_new_channel(A, "bad prefix", NULL, NULL, &name, NULL), CN_INVALID_NAME);
    {
        char longname[128];
        memset(longname, 'a', 100);
        longname[100] = '\0';
        EXPECT_FAIL(cn_send(A, longname, x.data, x.len, NULL, NULL, NULL), CN_INVALID_NAME);
    }

    /* bad configuration */
    EXPECT_FAIL(cn_connect("{not json", NULL, NULL, NULL, NULL, &c), CN_INVALID_CONFIG);
    EXPECT_FAIL(cn_connect("[1, 2]", NULL, NULL, NULL, NULL, &c), CN_INVALID_CONFIG);
    EXPECT_FAIL(cn_connect("{\"no_such_key\": 1}", NULL, NULL, NULL, NULL, &c), CN_INVALID_CONFIG);
    REQUIRE(strstr(cn_last_error(), "servers") != NULL,
            "unknown key: cn_last_error() does not list the known keys: %s", cn_last_error());
    EXPECT_FAIL(cn_connect("{\"capacity\": \"many\"}", NULL, NULL, NULL, NULL, &c),
                CN_INVALID_CONFIG);

    /* bodies that are not Channels messages */
    EXPECT_FAIL(cn_send(A, ch, array_body, sizeof array_body, NULL, NULL, NULL), CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, int_key_body, sizeof int_key_body, NULL, NULL, NULL),
                CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, trailing_body, sizeof trailing_body, NULL, NULL, NULL),
                CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, truncated_body, sizeof truncated_body, NULL, NULL, NULL),
                CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, reserved_body, sizeof reserved_body, NULL, NULL, NULL),
                CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_group_send(A, "g", array_body, sizeof array_body, NULL, NULL, NULL),
                CN_INVALID_MESSAGE);
    {
        cn_status st = cn_send(A, ch, x.data, 0, NULL, NULL, NULL); /* an empty body */
        REQUIRE(st == CN_INVALID_MESSAGE || st == CN_INVALID_ARG,
                "empty body: got %d (%s), want CN_INVALID_MESSAGE or CN_INVALID_ARG", (int)st,
                cn_status_text(st));
    }

    /* over the server's max_payload (1 MiB by default): nothing sent */
    {
        size_t n = 1100 * 1024, i = 0;
        big = calloc(1, n + 16);
        REQUIRE(big != NULL, "out of memory");
        big[i++] = 0x81;
        big[i++] = 0xa1;
        big[i++] = 'b';
        big[i++] = 0xc6; /* bin 32 */
        big[i++] = (uint8_t)(n >> 24);
        big[i++] = (uint8_t)(n >> 16);
        big[i++] = (uint8_t)(n >> 8);
        big[i++] = (uint8_t)n;
        EXPECT_FAIL(cn_send(A, ch, big, i + n, NULL, NULL, NULL), CN_MESSAGE_TOO_LARGE);
    }

    /* another client's process channel: receive and group_add refused, send works */
    EXPECT_FAIL(cn_receive(A, chb, on_result, &g_sink, &body, &len, &op), CN_FOREIGN_CHANNEL);
    EXPECT_FAIL(cn_group_add(A, "g", chb, NULL, NULL, NULL), CN_FOREIGN_CHANNEL);

    /* handles the library never issued */
    EXPECT_FAIL(cn_send(0, ch, x.data, x.len, NULL, NULL, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_send((cn_client)1 << 60, ch, x.data, x.len, NULL, NULL, NULL),
                CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_receive(0, ch, on_result, &g_sink, &body, &len, &op), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_new_channel(UINT64_MAX, NULL, NULL, NULL, &name, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_stats(987654321, &json), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_flush(0), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_close(0, NULL, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_cancel(0, 1), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_cancel(A, 0), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_group_discard((cn_client)1 << 62, "g", ch), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_put_back(0, ch, x.data, x.len), CN_INVALID_HANDLE);

    /* a closed client */
    config_json(cfg, sizeof cfg);
    EXPECT_OK(cn_connect(cfg, NULL, NULL, NULL, NULL, &c));
    EXPECT_OK(cn_close(c, NULL, NULL));
    EXPECT_FAIL(cn_send(c, ch, x.data, x.len, NULL, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_group_send(c, "g", x.data, x.len, NULL, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_receive(c, ch, on_result, &g_sink, &body, &len, &op), CN_CLOSED);
    EXPECT_FAIL(cn_new_channel(c, NULL, NULL, NULL, &name, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_group_add(c, "g", ch, NULL, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_group_discard(c, "g", ch), CN_CLOSED);
    EXPECT_FAIL(cn_put_back(c, ch, x.data, x.len), CN_CLOSED);
    EXPECT_FAIL(cn_flush(c), CN_CLOSED);
    EXPECT_FAIL(cn_stats(c, &json), CN_CLOSED);
    EXPECT_FAIL(cn_cancel(c, 1), CN_CLOSED);
    EXPECT_FAIL(cn_close(c, NULL, NULL), CN_CLOSED);
    c = 0;
    ok = 1;
out:
    cn_free(name);
    cn_free(json);
    free(big);
    if (c != 0) {
        cn_close(c, NULL, NULL);
    }
    return ok;
}

/* A receive callback that tries waiting calls (refused) and a send (allowed) from inside. */
static void on_result_inner(void *closure, cn_status status, const char *text,
                            const uint8_t *data, size_t len) {
    result_t *r = closure;
    uint8_t *body = NULL;
    size_t blen = 0;
    cn_client c2 = 0;
    body_t x = body_of("sent-from-a-callback");
    r->inner_wait_receive =
        cn_receive(r->inner_client, r->inner_channel, NULL, NULL, &body, &blen, NULL);
    r->inner_error_set = cn_last_error()[0] != '\0';
    r->inner_wait_close = cn_close(r->inner_client, NULL, NULL);
    r->inner_wait_connect = cn_connect(NULL, NULL, NULL, NULL, NULL, &c2);
    r->inner_send = cn_send(r->inner_client, r->inner_channel, x.data, x.len, NULL, NULL, NULL);
    cn_free(body);
    on_result(closure, status, text, data, len);
}

static int check_callback_rules(char *why) {
    char ch[128];
    body_t x = body_of("wake-the-callback"), y = body_of("sent-from-a-callback");
    msg_t m = {NULL, 0};
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    result_t r;
    int ok = 0;
    result_init(&r);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    r.inner_client = A;
    r.inner_channel = ch;
    EXPECT_ST(cn_receive(A, ch, on_result_inner, &r, &body, &len, &op), CN_PENDING);
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL));
    REQUIRE(result_wait(&r, 1, 5000) == 1, "callback did not run");
    REQUIRE(r.inner_wait_receive == CN_ILLEGAL_STATE,
            "waiting cn_receive inside a callback: %d, want CN_ILLEGAL_STATE",
            (int)r.inner_wait_receive);
    REQUIRE(r.inner_error_set, "cn_last_error() empty after CN_ILLEGAL_STATE in a callback");
    REQUIRE(r.inner_wait_close == CN_ILLEGAL_STATE,
            "waiting cn_close inside a callback: %d, want CN_ILLEGAL_STATE",
            (int)r.inner_wait_close);
    REQUIRE(r.inner_wait_connect == CN_ILLEGAL_STATE,
            "waiting cn_connect inside a callback: %d, want CN_ILLEGAL_STATE",
            (int)r.inner_wait_connect);
    REQUIRE(r.inner_send == CN_OK, "cn_send inside a callback: %d", (int)r.inner_send);
    EXPECT_ST(recv_msg(A, ch, 5000, &m, NULL), CN_OK);
    REQUIRE(msg_is(&m, &y), "the message sent from the callback did not arrive");
    ok = 1;
out:
    msg_free(&m);
    result_destroy(&r);
    return ok;
}

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

static void on_log(void *closure, int level, const char *message) {
    int *count = closure;
    (void)level;
    (void)message;
    pthread_mutex_lock(&g_log_mu);
    (*count)++;
    pthread_mutex_unlock(&g_log_mu);
}

static int log_count(int *count) {
    int n;
    pthread_mutex_lock(&g_log_mu);
    n = *count;
    pthread_mutex_unlock(&g_log_mu);
    return n;
}

static int check_pending_close(char *why) {
    static int logs; /* outlives the client, whatever happens */
    char cfg[512], ch[128], plain[64];
    body_t x = body_of("after-close");
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op1 = 0, op2 = 0;
    cn_client c = 0;
    result_t r1, r2, rc;
    int ok = 0, logs_at_close;
    result_init(&r1);
    result_init(&r2);
    result_init(&rc);
    config_json(cfg, sizeof cfg);
    EXPECT_OK(cn_connect(cfg, on_log, &logs, NULL, NULL, &c));
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    snprintf(plain, sizeof plain, "closing.q%ld", (long)getpid());
    EXPECT_ST(cn_receive(c, ch, on_result, &r1, &body, &len, &op1), CN_PENDING);
    EXPECT_ST(cn_receive(c, plain, on_result, &r2, &body, &len, &op2), CN_PENDING);
    EXPECT_ST(cn_close(c, on_result, &rc), CN_PENDING);
    EXPECT_FAIL(cn_close(c, NULL, NULL), CN_CLOSED); /* already closing */
    REQUIRE(result_wait(&rc, 1, 10000) == 1, "the close callback did not run within 10 s");
    logs_at_close = log_count(&logs);
    REQUIRE(rc.status == CN_OK, "close callback status %d, want CN_OK", (int)rc.status);
    REQUIRE(result_calls(&r1) == 1 && r1.status == CN_CLOSED,
            "process receive: %d calls, status %d; want 1 call with CN_CLOSED", result_calls(&r1),
            (int)r1.status);
    REQUIRE(result_calls(&r2) == 1 && r2.status == CN_CLOSED,
            "plain receive: %d calls, status %d; want 1 call with CN_CLOSED", result_calls(&r2),
            (int)r2.status);
    REQUIRE(r1.seq < rc.seq && r2.seq < rc.seq,
            "a receive callback ran after the close callback (seq %ld, %ld, close %ld)", r1.seq,
            r2.seq, rc.seq);
    REQUIRE(r1.has_text && r1.text[0], "CN_CLOSED callback without an error text");
    EXPECT_FAIL(cn_send(c, ch, x.data, x.len, NULL, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_close(c, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_cancel(c, op1), CN_CLOSED);
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL)); /* nobody may receive it */
    sleep_ms(300);
    REQUIRE(result_calls(&r1) == 1 && result_calls(&r2) == 1 && result_calls(&rc) == 1,
            "a callback ran after close: receive %d/%d, close %d", result_calls(&r1),
            result_calls(&r2), result_calls(&rc));
    REQUIRE(log_count(&logs) == logs_at_close, "the log callback ran %d time(s) after close",
            log_count(&logs) - logs_at_close);
    c = 0;
    ok = 1;
out:
    if (c != 0 && result_calls(&rc) == 0) {
        result_wait(&rc, 1, 10000);
    }
    result_destroy(&r1);
    result_destroy(&r2);
    result_destroy(&rc);
    return ok;
}

/* A waiting-form receive blocked on another thread ends with CN_CLOSED when the client closes. */
typedef struct {
    cn_client c;
    const char *channel;
    cn_status status;
    volatile int done;
} waiter_t;

static void *waiting_receive(void *arg) {
    waiter_t *w = arg;
    uint8_t *body = NULL;
    size_t len = 0;
    w->status = cn_receive(w->c, w->channel, NULL, NULL, &body, &len, NULL);
    cn_free(body);
    w->done = 1;
    return NULL;
}

static int check_waiting_receive_closed(char *why) {
    char ch[128];
    cn_client c = 0;
    pthread_t t;
    waiter_t w;
    int ok = 0, started = 0;
    EXPECT_OK(connect_wait(&c));
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    w.c = c;
    w.channel = ch;
    w.status = (cn_status)-1;
    w.done = 0;
    REQUIRE(pthread_create(&t, NULL, waiting_receive, &w) == 0, "pthread_create failed");
    started = 1;
    sleep_ms(200);
    REQUIRE(!w.done, "the waiting receive returned %d before anything was sent", (int)w.status);
    EXPECT_OK(cn_close(c, NULL, NULL));
    c = 0;
    pthread_join(t, NULL);
    started = 0;
    REQUIRE(w.status == CN_CLOSED, "the waiting receive returned %d (%s), want CN_CLOSED",
            (int)w.status, cn_status_text(w.status));
    ok = 1;
out:
    if (c != 0) {
        cn_close(c, NULL, NULL);
    }
    if (started) {
        pthread_join(t, NULL);
    }
    return ok;
}

/* cn_cancel of an op handle the library never issued: CN_INVALID_HANDLE ("0, or a handle this
   library never issued"), not CN_NOT_PENDING ("the operation had already finished"). */
static int check_cancel_unknown_op(char *why) {
    EXPECT_FAIL(cn_cancel(A, (cn_op)1 << 60), CN_INVALID_HANDLE);
    return 1;
out:
    return 0;
}

/* S13: "specific.<id>!" receives the messages of this client's process channels that have no
   mailbox of their own. */
static int check_receive_process_prefix(char *why) {
    char ch[128], prefix[64], orphan[128];
    body_t x = body_of("no-mailbox-of-its-own");
    msg_t m = {NULL, 0};
    int ok = 0;
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    snprintf(prefix, sizeof prefix, "%.22s", ch); /* "specific.<12 hex>!" */
    snprintf(orphan, sizeof orphan, "%sneverreceived%ld", prefix, (long)getpid());
    {
        /* the prefix receive must be waiting before the send, or the message has no mailbox */
        result_t r;
        uint8_t *body = NULL;
        size_t len = 0;
        cn_op op = 0;
        result_init(&r);
        if (cn_receive(A, prefix, on_result, &r, &body, &len, &op) != CN_PENDING) {
            snprintf(why, WHYLEN, "cn_receive(\"%s\"): %s", prefix, cn_last_error());
            cn_free(body);
            result_destroy(&r);
            goto out;
        }
        cn_send(B, orphan, x.data, x.len, NULL, NULL, NULL);
        if (result_wait(&r, 1, 5000) == 0) {
            if (cn_cancel(A, op) != CN_OK) {
                result_wait(&r, 1, 5000);
            }
        }
        if (r.calls == 1 && r.status == CN_OK) {
            m.data = r.data;
            m.len = r.len;
            r.data = NULL;
        }
        result_destroy(&r);
    }
    REQUIRE(m.data != NULL, "the prefix receive got nothing for %s", orphan);
    REQUIRE(msg_is(&m, &x), "the prefix receive got a different body");
    ok = 1;
out:
    msg_free(&m);
    return ok;
}

/* A TCP listener that never answers: connects to it stay in progress (the kernel accepts). */
static int silent_listener(int *port) {
    struct sockaddr_in sa;
    socklen_t n = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        return -1;
    }
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &n) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A connect still in progress: calls get CN_ILLEGAL_STATE; cn_close abandons it, its callback
   reports CN_CLOSED before cn_close returns, and nothing runs after. */
static int check_close_abandons_connect(char *why) {
    char cfg[256], *json = NULL;
    body_t x = body_of("too-early");
    cn_client c = 0, was;
    result_t r;
    int ok = 0, port = 0, fd;
    double t0;
    result_init(&r);
    fd = silent_listener(&port);
    REQUIRE(fd >= 0, "cannot open a listener: %s", strerror(errno));
    snprintf(cfg, sizeof cfg,
             "{\"servers\": [\"nats://127.0.0.1:%d\"], \"connect_options\": {\"connect_timeout\": 20}}",
             port);
    EXPECT_ST(cn_connect(cfg, NULL, NULL, on_result, &r, &c), CN_PENDING);
    REQUIRE(c != 0, "no handle with CN_PENDING");
    EXPECT_FAIL(cn_send(c, "work.early", x.data, x.len, NULL, NULL, NULL), CN_ILLEGAL_STATE);
    EXPECT_FAIL(cn_stats(c, &json), CN_ILLEGAL_STATE);
    REQUIRE(result_calls(&r) == 0, "the connect finished against a server that never answers");
    t0 = now_s();
    EXPECT_OK(cn_close(c, NULL, NULL));
    REQUIRE(now_s() - t0 < 5.0 * g_scale, "cn_close took %.1f s to abandon the connect", now_s() - t0);
    REQUIRE(result_calls(&r) == 1, "the connect callback ran %d times by the time cn_close returned",
            result_calls(&r));
    REQUIRE(r.status == CN_CLOSED, "connect callback status %d (%s), want CN_CLOSED", (int)r.status,
            cn_status_text(r.status));
    was = c;
    c = 0;
    EXPECT_FAIL(cn_flush(was), CN_CLOSED);
    sleep_ms(100);
    REQUIRE(result_calls(&r) == 1, "the connect callback ran again after close");
    ok = 1;
out:
    cn_free(json);
    if (c != 0) {
        cn_close(c, NULL, NULL);
    }
    if (fd >= 0) {
        close(fd);
    }
    result_destroy(&r);
    return ok;
}

/* Concurrent use from several threads: each does send/receive round trips on its own channel. */
#define THREADS 4
#define ROUNDS 25

typedef struct {
    int index;
    char failure[200];
} worker_t;

static void *round_trip_worker(void *arg) {
    worker_t *w = arg;
    char ch[128], text[64];
    int i;
    if (new_channel(A, ch, sizeof ch) != CN_OK) {
        snprintf(w->failure, sizeof w->failure, "new_channel: %s", cn_last_error());
        return NULL;
    }
    for (i = 0; i < ROUNDS; i++) {
        body_t b;
        msg_t m = {NULL, 0};
        cn_status st;
        snprintf(text, sizeof text, "thread-%d-round-%d", w->index, i);
        b = body_of(text);
        st = cn_send(B, ch, b.data, b.len, NULL, NULL, NULL);
        if (st == CN_OK) {
            st = recv_msg(A, ch, 5000, &m, NULL);
        }
        if (st != CN_OK || !msg_is(&m, &b)) {
            snprintf(w->failure, sizeof w->failure, "round %d: status %d, %s", i, (int)st,
                     st == CN_OK ? "wrong body" : cn_last_error());
            msg_free(&m);
            return NULL;
        }
        msg_free(&m);
    }
    return NULL;
}

static int check_threads(char *why) {
    pthread_t t[THREADS];
    worker_t w[THREADS];
    int i, ok = 1;
    for (i = 0; i < THREADS; i++) {
        w[i].index = i;
        w[i].failure[0] = '\0';
        pthread_create(&t[i], NULL, round_trip_worker, &w[i]);
    }
    for (i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (w[i].failure[0] && ok) {
            snprintf(why, WHYLEN, "thread %d: %s", i, w[i].failure);
            ok = 0;
        }
    }
    return ok;
}

/* ---- result queues ---------------------------------------------------------------------- */

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

/* Reads and discards what waits on the non-blocking fd; returns how many bytes. */
static int drain_fd(int fd) {
    char buf[64];
    int total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n > 0) {
            total += (int)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            return total;
        }
    }
}

/* poll() for POLLIN within timeout_ms (scaled). */
static int wait_readable(int fd, long timeout_ms) {
    struct pollfd p;
    int n;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    do {
        n = poll(&p, 1, (int)(timeout_ms * g_scale));
    } while (n < 0 && errno == EINTR);
    return n > 0 && (p.revents & POLLIN) != 0;
}

/* A queue with a pipe as notify: argument checks; a pending receive finishes through the queue
   (one byte on the pipe, poll(), cn_queue_take, cn_free of the block) and never through its
   callback; cn_queue_free is refused while the client is open; a receive ended by cn_close is
   taken after the close; then the queue is freed and its handle is invalid, the pipe still open.
   A second queue (no notify) is freed with a result nobody took. */
static int check_result_queue(char *why) {
    char ch[128], plain[64];
    body_t x = body_of("through-the-queue");
    cn_queue q = 0, q2 = 0;
    cn_client c = 0, c2 = 0;
    cn_result res[4];
    size_t count = 99;
    void *mem = NULL;
    uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    result_t r, r2, r3;
    int fds[2] = {-1, -1}, ok = 0;
    result_init(&r);
    result_init(&r2);
    result_init(&r3);
    REQUIRE(pipe(fds) == 0, "pipe: %s", strerror(errno));
    REQUIRE(set_nonblock(fds[0]) && set_nonblock(fds[1]), "fcntl: %s", strerror(errno));

    EXPECT_FAIL(cn_queue_new(fds[1], NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_new(-2, &q), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_new(1 << 20, &q), CN_INVALID_ARG); /* not an open descriptor */
    EXPECT_OK(cn_queue_new(fds[1], &q));
    REQUIRE(q != 0, "cn_queue_new: CN_OK with handle 0");
    EXPECT_OK(cn_queue_take(q, res, 4, &count, &mem));
    REQUIRE(count == 0 && mem == NULL, "an empty queue gave count %zu, memory %p", count, mem);
    EXPECT_OK(cn_queue_take(q, NULL, 0, &count, &mem));
    EXPECT_FAIL(cn_queue_take(q, res, 4, NULL, &mem), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_take(q, res, 4, &count, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_take(q, NULL, 4, &count, &mem), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_take(0, res, 4, &count, &mem), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_set_result_queue(0, q), CN_INVALID_HANDLE);

    EXPECT_OK(connect_wait(&c));
    EXPECT_FAIL(cn_set_result_queue(c, (cn_queue)1 << 60), CN_INVALID_HANDLE);
    EXPECT_OK(cn_set_result_queue(c, q));
    EXPECT_FAIL(cn_set_result_queue(c, q), CN_ILLEGAL_STATE); /* once */
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    EXPECT_ST(cn_receive(c, ch, on_result, &r, &body, &len, &op), CN_PENDING);
    REQUIRE(!wait_readable(fds[0], 20), "notify readable before anything was sent");
    EXPECT_OK(cn_send(B, ch, x.data, x.len, NULL, NULL, NULL));
    REQUIRE(wait_readable(fds[0], 5000), "no notify byte within 5 s of the send");
    REQUIRE(drain_fd(fds[0]) >= 1, "notify readable but empty");
    EXPECT_OK(cn_queue_take(q, res, 4, &count, &mem)); /* after reading the byte, as the host must */
    REQUIRE(count == 1 && mem != NULL, "take after the notify byte: count %zu, memory %p", count, mem);
    REQUIRE(res[0].closure == (void *)&r, "result closure %p, want %p", res[0].closure, (void *)&r);
    REQUIRE(res[0].status == CN_OK && res[0].text == NULL, "result status %d, text %s",
            (int)res[0].status, res[0].text ? res[0].text : "(NULL)");
    REQUIRE(res[0].len == x.len && res[0].data != NULL && memcmp(res[0].data, x.data, x.len) == 0,
            "result body differs (len %zu vs %zu)", res[0].len, x.len);
    cn_free(mem);
    mem = NULL;
    EXPECT_FAIL(cn_cancel(c, op), CN_NOT_PENDING);
    EXPECT_OK(cn_queue_take(q, res, 4, &count, &mem));
    REQUIRE(count == 0 && mem == NULL, "a second take gave %zu results", count);

    /* a receive still pending when the client closes: CN_CLOSED in the queue, taken after */
    snprintf(plain, sizeof plain, "queued.q%ld", (long)getpid());
    EXPECT_ST(cn_receive(c, plain, on_result, &r2, &body, &len, &op), CN_PENDING);
    EXPECT_FAIL(cn_queue_free(q), CN_ILLEGAL_STATE); /* c is attached and open */
    EXPECT_OK(cn_close(c, NULL, NULL));
    c = 0;
    REQUIRE(wait_readable(fds[0], 5000), "no notify byte for the result of the close");
    drain_fd(fds[0]);
    EXPECT_OK(cn_queue_take(q, res, 4, &count, &mem));
    REQUIRE(count == 1 && mem != NULL, "take after the close: count %zu", count);
    REQUIRE(res[0].closure == (void *)&r2 && res[0].status == CN_CLOSED && res[0].text != NULL &&
                res[0].text[0] != '\0' && res[0].data == NULL && res[0].len == 0,
            "result of the close: closure %p status %d text %s len %zu", res[0].closure,
            (int)res[0].status, res[0].text ? res[0].text : "(NULL)", res[0].len);
    cn_free(mem);
    mem = NULL;
    REQUIRE(result_calls(&r) == 0 && result_calls(&r2) == 0,
            "a callback of a queued operation ran (%d, %d)", result_calls(&r), result_calls(&r2));

    EXPECT_OK(cn_queue_free(q));
    EXPECT_FAIL(cn_queue_take(q, res, 4, &count, &mem), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_queue_free(q), CN_INVALID_HANDLE);
    q = 0;
    REQUIRE(write(fds[1], "x", 1) == 1, "notify no longer writable after cn_queue_free: %s",
            strerror(errno));

    /* no notify; a result nobody takes is discarded with the queue */
    EXPECT_OK(cn_queue_new(-1, &q2));
    EXPECT_OK(connect_wait(&c2));
    EXPECT_OK(cn_set_result_queue(c2, q2));
    EXPECT_ST(cn_receive(c2, plain, on_result, &r3, &body, &len, &op), CN_PENDING);
    EXPECT_OK(cn_close(c2, NULL, NULL));
    c2 = 0;
    EXPECT_OK(cn_queue_free(q2));
    q2 = 0;
    REQUIRE(result_calls(&r3) == 0, "the callback of a queued receive ran");
    ok = 1;
out:
    cn_free(mem);
    cn_free(body);
    if (c != 0) {
        cn_close(c, NULL, NULL);
    }
    if (c2 != 0) {
        cn_close(c2, NULL, NULL);
    }
    if (q != 0) {
        cn_queue_free(q);
    }
    if (q2 != 0) {
        cn_queue_free(q2);
    }
    if (fds[0] >= 0) {
        close(fds[0]);
    }
    if (fds[1] >= 0) {
        close(fds[1]);
    }
    result_destroy(&r);
    result_destroy(&r2);
    result_destroy(&r3);
    return ok;
}

static int check_close_clients(char *why) {
    EXPECT_OK(cn_close(A, NULL, NULL));
    EXPECT_OK(cn_close(B, NULL, NULL));
    EXPECT_FAIL(cn_flush(A), CN_CLOSED);
    A = B = 0;
    return 1;
out:
    return 0;
}

/* ---- main ------------------------------------------------------------------------------- */

typedef int (*check_fn)(char *why);

static void run(const char *name, check_fn fn) {
    char why[WHYLEN];
    why[0] = '\0';
    report(name, fn(why), why);
}

static int leak_selftest(void) {
    cn_client c = 0;
    char *name = NULL;
    if (connect_wait(&c) != CN_OK || cn_new_channel(c, NULL, NULL, NULL, &name, NULL) != CN_OK) {
        fprintf(stderr, "leak-selftest: %s\n", cn_last_error());
        return 1;
    }
    printf("leak-selftest: left %s (%zu bytes) unfreed on purpose\n", name, strlen(name) + 1);
    name = NULL; /* lose the pointer: valgrind must call it definitely lost */
    cn_close(c, NULL, NULL);
    return 0;
}

int main(int argc, char **argv) {
    const char *env;
    char ch1[128] = "", ch2[128] = "", group[64];
    int timeout = 90;
    if (argc < 2) {
        fprintf(stderr, "usage: %s NATS_URL [--leak-selftest]\n", argv[0]);
        return 2;
    }
    g_url = argv[1];
    if ((env = getenv("CTEST_TIMEOUT")) != NULL && atoi(env) > 0) {
        timeout = atoi(env);
    }
    if ((env = getenv("CTEST_SCALE")) != NULL && atoi(env) > 0) {
        g_scale = atoi(env);
    }
    result_init(&g_sink);
    alarm((unsigned)timeout); /* a hang ends the run (SIGALRM kills) instead of blocking CI */
    snprintf(g_prefix, sizeof g_prefix, "ctest%ld", (long)getpid());
    snprintf(group, sizeof group, "fan%ld", (long)getpid());
    if (argc > 2 && strcmp(argv[2], "--leak-selftest") == 0) {
        return leak_selftest();
    }

    run("version_and_status_text", check_version_status_text);
    run("connect_wait", check_connect_wait);
    if (A == 0 || B == 0) { /* connect_wait failed: the other checks need the clients */
        printf("(the remaining checks need a connection and did not run)\n");
        printf("%d passed, %d failed\n", g_passed, g_failed);
        return 1;
    }
    run("connect_pending", check_connect_pending);
    run("connect_no_server", check_connect_no_server);
    run("new_channel", check_new_channel);
    run("send_receive_immediate", check_send_receive_immediate);
    run("pending_receive", check_pending_receive);
    run("plain_channel_shared", check_plain_channel_shared);
    {
        char why[WHYLEN];
        why[0] = '\0';
        report("group_fanout", check_group_fanout(why, ch1, ch2, group), why);
    }
    run("group_fanout_two_clients", check_group_fanout_clients);
    {
        char why[WHYLEN];
        why[0] = '\0';
        report("group_discard", check_group_discard(why, ch1, ch2, group), why);
    }
    run("cancel_before_delivery", check_cancel_before_delivery);
    run("put_back", check_put_back);
    run("receive_many", check_receive_many);
    run("put_back_many", check_put_back_many);
    run("stream", check_stream);
    run("stream_messages_waiting", check_stream_messages_waiting);
    run("stream_closed", check_stream_closed);
    run("stats", check_stats);
    run("flush", check_flush);
    run("errors", check_errors);
    run("callback_rules", check_callback_rules);
    run("cancel_unknown_op", check_cancel_unknown_op);
    run("receive_process_prefix", check_receive_process_prefix);
    run("close_abandons_connect", check_close_abandons_connect);
    run("threads", check_threads);
    run("result_queue", check_result_queue);
    run("waiting_receive_closed", check_waiting_receive_closed);
    run("pending_close", check_pending_close);
    run("close_clients", check_close_clients);

    printf("%d passed, %d failed\n", g_passed, g_failed);
    fflush(stdout);
    return g_failed == 0 ? 0 : 1;
}

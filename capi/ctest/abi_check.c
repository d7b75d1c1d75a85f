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
 * Every result comes through a result queue signalled on a pipe and watched with poll()
 * (queue_host.h), the path every host uses. Checks (in order): version and status texts; queue
 * arguments (new, take, free); connect through the queue (always pending, op = the client);
 * the first new_channel (at once or pending, name in the result text); connect failure (no
 * credentials in the error); new_channel names; send and receive at once (op 0, nothing
 * queued); a pending receive (one notify byte, the result's fields); notify bytes (one per
 * empty-to-non-empty, one for a burst of results made by one group message); lent bodies (valid
 * until the next take or receive with the same queue, never released by another queue); a
 * plain channel shared by two clients; group fan-out (one client, two clients); group_discard;
 * cancel of a waiting receive, of a queued result and of a taken result (the message comes back
 * to the front), and after the next take (kept); queue_free with a pending receive (the message
 * is received later through another queue), with an untaken result (back to the mailbox), with
 * a connect in progress (closed); a send that goes pending on a full outbound buffer and
 * completes CN_OK; stats; flush; every error status with cn_last_error(); calls from the log
 * callback refused; cancel of an op never issued; the "specific.<id>!" prefix receive; close
 * abandoning a connect; concurrent threads, each with its own queue; pending close ordering
 * (CN_CLOSED results in their own queues before the close's result, nothing after); closing the
 * clients (statistics in the close's result).
 *
 * Output: one line per check, "ok   <name>" or "FAIL <name>: <detail>", then "N passed, M failed".
 * Every pointer the library returns through char ** is released with cn_free(); lent bodies and
 * texts are copied, never freed. CTEST_TIMEOUT (seconds, default 90) bounds the whole run with
 * alarm(); CTEST_SCALE (default 1) multiplies the waits (slow runs under valgrind).
 *
 * Build: gcc -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -pedantic
 *        -I build/<goos>-<goarch> abi_check.c -L build/<goos>-<goarch> -lchannels_nats -pthread
 */
#include <errno.h>
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
#include "queue_host.h"

#define WHYLEN 512

/* ---- small utilities ------------------------------------------------------------------- */

static const char *g_url;
static char g_prefix[64]; /* subject prefix of this run, so parallel runs never meet */
static int g_scale = 1;
static int g_passed, g_failed;

/* A wait of ms milliseconds, scaled for slow runs. */
#define MS(ms) ((long)(ms) * g_scale)

static void sleep_ms(long ms) { hq_sleep_ms(MS(ms)); }

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

static int bytes_are(const uint8_t *data, size_t len, const body_t *b) {
    return data != NULL && len == b->len && memcmp(data, b->data, b->len) == 0;
}

static int got_is(const hq_got *g, const body_t *b) { return bytes_are(g->data, g->len, b); }

/* ---- helpers over the library ------------------------------------------------------------ */

static hq_t Q;        /* the main queue: connects, closes and most operations of the checks */
static cn_client A, B; /* two connected clients shared by the checks */
static int g_tag;     /* its address is a closure the results must carry back unchanged */
#define TAG ((void *)&g_tag)

/* The client configuration JSON for g_url and g_prefix, with extra top-level members and extra
   connect_options members (each NULL or "\"key\": value, ..."). The connect bounds are generous:
   under valgrind a loopback dial can take longer than the defaults (2 s, 5 s). */
static void config_json(char *buf, size_t n, const char *extra, const char *conn_extra) {
    snprintf(buf, n,
             "{\"servers\": [\"%s\"], \"prefix\": \"%s\", \"release_linger\": 0.2, "
             "\"connect_deadline\": 30%s%s, \"connect_options\": {\"connect_timeout\": 20%s%s}}",
             g_url, g_prefix, extra ? ", " : "", extra ? extra : "", conn_extra ? ", " : "",
             conn_extra ? conn_extra : "");
}

/* Connects through h (cn_connect is always pending; its result names the client) and returns
   the result's status, HQ_NO_RESULT if none came. */
static cn_status connect_on(hq_t *h, const char *cfg, cn_log_callback log, void *log_closure,
                            cn_client *c) {
    return hq_settle(h, cn_connect(cfg, log, log_closure, h->q, NULL, c), *c, MS(40000), NULL);
}

static cn_status connect_client(cn_client *c) {
    char cfg[512];
    config_json(cfg, sizeof cfg, NULL, NULL);
    return connect_on(&Q, cfg, NULL, NULL, c);
}

/* Closes c through h (always pending; the result names the client); out may be NULL. */
static cn_status close_on(hq_t *h, cn_client c, hq_got *out) {
    return hq_settle(h, cn_close(c, h->q, NULL), c, MS(20000), out);
}

/* A new process channel of c, at once or through h; the name is copied into out. */
static cn_status new_channel_on(hq_t *h, cn_client c, char *out, size_t n) {
    char *name = NULL;
    cn_op op = 0;
    hq_got g;
    cn_status st = cn_new_channel(c, NULL, h->q, NULL, &name, &op);
    out[0] = '\0';
    hq_got_init(&g);
    if (st == CN_OK) {
        if (name == NULL) {
            st = CN_INTERNAL;
        } else {
            snprintf(out, n, "%s", name);
        }
    } else if (st == CN_PENDING) {
        st = hq_settle(h, st, op, MS(10000), &g);
        if (st == CN_OK && !g.has_text) {
            st = CN_INTERNAL;
        } else if (st == CN_OK) {
            snprintf(out, n, "%s", g.text); /* the name is lent: copied */
        }
    }
    cn_free(name);
    hq_got_clear(&g);
    return st;
}

static cn_status new_channel(cn_client c, char *out, size_t n) {
    return new_channel_on(&Q, c, out, n);
}

static cn_status group_add_on(hq_t *h, cn_client c, const char *group, const char *channel) {
    cn_op op = 0;
    return hq_settle(h, cn_group_add(c, group, channel, h->q, NULL, &op), op, MS(10000), NULL);
}

static cn_status group_add(cn_client c, const char *group, const char *channel) {
    return group_add_on(&Q, c, group, channel);
}

static cn_status send_on(hq_t *h, cn_client c, const char *channel, const body_t *b) {
    cn_op op = 0;
    return hq_settle(h, cn_send(c, channel, b->data, b->len, h->q, NULL, &op), op, MS(15000), NULL);
}

static cn_status send_msg(cn_client c, const char *channel, const body_t *b) {
    return send_on(&Q, c, channel, b);
}

static cn_status group_send(cn_client c, const char *group, const body_t *b) {
    cn_op op = 0;
    return hq_settle(&Q, cn_group_send(c, group, b->data, b->len, Q.q, NULL, &op), op, MS(15000),
                     NULL);
}

/* Receives one message of channel through h within timeout_ms (cancelled on timeout). Returns
   CN_OK with *out a copy, CN_TIMEOUT when nothing came, or the error. *immediate (may be NULL)
   tells whether cn_receive finished at once. */
static cn_status recv_on(hq_t *h, cn_client c, const char *channel, long timeout_ms, msg_t *out,
                         int *immediate) {
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    hq_got g;
    cn_status st;
    out->data = NULL;
    out->len = 0;
    if (immediate) {
        *immediate = 0;
    }
    st = cn_receive(c, channel, h->q, NULL, &body, &len, &op);
    if (st == CN_OK) {
        if (immediate) {
            *immediate = 1;
        }
        if (body == NULL || op != 0) {
            return CN_INTERNAL;
        }
        out->data = malloc(len ? len : 1); /* lent until the next take or receive with h */
        if (out->data == NULL) {
            abort();
        }
        memcpy(out->data, body, len);
        out->len = len;
        return CN_OK;
    }
    if (st != CN_PENDING) {
        return st;
    }
    hq_got_init(&g);
    if (hq_await(h, op, MS(timeout_ms), &g) != 1) {
        if (hq_cancel(h, c, op) == CN_OK) {
            return CN_TIMEOUT; /* withdrawn; a message it had got is back in the mailbox */
        }
        if (hq_await(h, op, MS(10000), &g) != 1) { /* CN_NOT_PENDING: the result is coming */
            return HQ_NO_RESULT;
        }
    }
    st = g.status;
    if (st == CN_OK) {
        out->data = g.data;
        out->len = g.len;
        g.data = NULL;
        if (out->data == NULL) {
            st = CN_INTERNAL;
        }
    }
    hq_got_clear(&g);
    return st;
}

static cn_status recv_msg(cn_client c, const char *channel, long timeout_ms, msg_t *out,
                          int *immediate) {
    return recv_on(&Q, c, channel, timeout_ms, out, immediate);
}

/* Nothing is in h nor arrives within ms: no stashed result, and a take finds none. */
static int queue_idle(hq_t *h, long ms) {
    cn_result res[HQ_BATCH];
    return h->nstash == 0 && hq_take(h, res, HQ_BATCH, MS(ms)) == 0;
}

/* After a failed check: drops what waits in the main queue, so the next check starts clean. */
static void queue_reset(hq_t *h) {
    cn_result res[HQ_BATCH];
    int i;
    for (i = 0; i < 100 && hq_take(h, res, HQ_BATCH, MS(100)) > 0; i++) {
    }
    for (i = 0; i < h->nstash; i++) {
        free(h->stash[i].data);
    }
    h->nstash = 0;
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
   subscription and one dispatcher, so once the marker arrived, every body is in ch's mailbox (or
   was handed to a receive waiting there). */
static cn_status send_and_settle(const char *ch, const char *mark, const body_t *bodies, int n) {
    body_t marker = body_of("settle-marker");
    msg_t m = {NULL, 0};
    cn_status st;
    int i;
    for (i = 0; i < n; i++) {
        if ((st = send_msg(B, ch, &bodies[i])) != CN_OK) {
            return st;
        }
    }
    if ((st = send_msg(B, mark, &marker)) != CN_OK) {
        return st;
    }
    st = recv_msg(A, mark, 5000, &m, NULL);
    if (st == CN_OK && !msg_is(&m, &marker)) {
        st = CN_INTERNAL;
    }
    msg_free(&m);
    return st;
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

/* A configuration whose only server is the silent listener on port. */
static void silent_config(char *buf, size_t n, int port) {
    snprintf(buf, n,
             "{\"servers\": [\"nats://127.0.0.1:%d\"], \"connect_deadline\": 30, "
             "\"connect_options\": {\"connect_timeout\": 20}}",
             port);
}

/* ---- the checks: the library and the queue ----------------------------------------------- */

static int check_version_status_text(char *why) {
    int i;
    REQUIRE(cn_version() != NULL && cn_version()[0] != '\0', "cn_version() is NULL or empty");
    for (i = CN_OK; i <= CN_INTERNAL; i++) {
        const char *t = cn_status_text((cn_status)i);
        if (i == 11) { /* not used any more: a text that says it is unknown */
            REQUIRE(t != NULL && t[0] != '\0' && strncmp(t, "CN_", 3) != 0,
                    "cn_status_text(11) = \"%s\", want an unknown-code text", t ? t : "(NULL)");
            continue;
        }
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

/* cn_queue_new, cn_queue_take and cn_queue_free on their own: arguments, an empty queue, a
   freed handle, and the notify descriptor left open. */
static int check_queue_basics(char *why) {
    cn_queue q = 0, q2 = 0;
    cn_result res[4];
    size_t count = 99;
    int fds[2] = {-1, -1}, ok = 0;
    REQUIRE(pipe(fds) == 0, "pipe: %s", strerror(errno));
    REQUIRE(hq_set_nonblock(fds[0]) && hq_set_nonblock(fds[1]), "fcntl: %s", strerror(errno));
    EXPECT_FAIL(cn_queue_new(fds[1], NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_new(-2, &q), CN_INVALID_ARG);
    REQUIRE(q == 0, "a refused cn_queue_new set the handle %llu", (unsigned long long)q);
    EXPECT_FAIL(cn_queue_new(1 << 20, &q), CN_INVALID_ARG); /* not an open descriptor */
    EXPECT_OK(cn_queue_new(fds[1], &q));
    REQUIRE(q != 0, "cn_queue_new: CN_OK with handle 0");
    EXPECT_OK(cn_queue_new(-1, &q2)); /* no notify: the host polls */
    REQUIRE(q2 != 0 && q2 != q, "the second queue's handle is %llu (first %llu)",
            (unsigned long long)q2, (unsigned long long)q);
    EXPECT_OK(cn_queue_take(q, res, 4, &count));
    REQUIRE(count == 0, "an empty queue gave count %zu", count);
    count = 99;
    EXPECT_OK(cn_queue_take(q, NULL, 0, &count));
    REQUIRE(count == 0, "capacity 0 gave count %zu", count);
    EXPECT_OK(cn_queue_take(q2, res, 4, &count));
    EXPECT_FAIL(cn_queue_take(q, res, 4, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_take(q, NULL, 4, &count), CN_INVALID_ARG);
    EXPECT_FAIL(cn_queue_take(0, res, 4, &count), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_queue_take((cn_queue)1 << 60, res, 4, &count), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_queue_free(0), CN_INVALID_HANDLE);
    REQUIRE(!hq_readable(fds[0], 0), "an empty queue wrote to its notify descriptor");
    EXPECT_OK(cn_queue_free(q));
    EXPECT_FAIL(cn_queue_take(q, res, 4, &count), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_queue_free(q), CN_INVALID_HANDLE);
    q = 0;
    REQUIRE(write(fds[1], "x", 1) == 1, "notify no longer writable after cn_queue_free: %s",
            strerror(errno));
    EXPECT_OK(cn_queue_free(q2));
    q2 = 0;
    ok = 1;
out:
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
    return ok;
}

/* Two connects at once through the main queue: CN_PENDING with the handle set at once, one
   notify byte, results whose op is the client handle, closure unchanged, no text, no data. */
static int check_connect_queue(char *why) {
    char cfg[512];
    hq_got ga, gb;
    int ok = 0;
    hq_got_init(&ga);
    hq_got_init(&gb);
    A = B = 0;
    config_json(cfg, sizeof cfg, NULL, NULL);
    REQUIRE(queue_idle(&Q, 0), "the new main queue is not empty");
    EXPECT_ST(cn_connect(cfg, NULL, NULL, Q.q, TAG, &A), CN_PENDING);
    REQUIRE(A != 0, "the handle is not set at once with CN_PENDING");
    REQUIRE(cn_last_error()[0] == '\0', "cn_last_error() is \"%s\" after CN_PENDING", cn_last_error());
    EXPECT_ST(cn_connect(cfg, NULL, NULL, Q.q, NULL, &B), CN_PENDING);
    REQUIRE(B != 0 && B != A, "client handle B is 0 or equals A");
    REQUIRE(hq_readable(Q.rd, MS(40000)), "no notify byte within 40 s of the connects");
    REQUIRE(hq_await(&Q, A, MS(40000), &ga) == 1, "no result for the connect of A");
    REQUIRE(hq_await(&Q, B, MS(40000), &gb) == 1, "no result for the connect of B");
    REQUIRE(ga.status == CN_OK, "connect of A: %d (%s): %.200s", (int)ga.status,
            cn_status_text(ga.status), ga.text);
    REQUIRE(gb.status == CN_OK, "connect of B: %d (%s): %.200s", (int)gb.status,
            cn_status_text(gb.status), gb.text);
    REQUIRE(ga.op == A && ga.closure == TAG, "A's result: op %llu closure %p, want %llu %p",
            (unsigned long long)ga.op, ga.closure, (unsigned long long)A, TAG);
    REQUIRE(gb.closure == NULL, "B's result closure %p, want NULL", gb.closure);
    REQUIRE(!ga.has_text && ga.data == NULL && ga.len == 0,
            "a successful connect's result has text \"%.200s\" or %zu bytes of data", ga.text, ga.len);
    REQUIRE(queue_idle(&Q, 50), "more results than the two connects");
    ok = 1;
out:
    hq_got_clear(&ga);
    hq_got_clear(&gb);
    return ok;
}

/* The first new_channel of a client may wait for its process subscription (its result's text is
   the name); once confirmed, new_channel finishes at once with op 0 and queues nothing. */
static int new_channel_first(cn_client c, char *why) {
    char *name = NULL;
    cn_op op = 77;
    hq_got g;
    cn_status st;
    int ok = 0;
    hq_got_init(&g);
    st = cn_new_channel(c, NULL, Q.q, TAG, &name, &op);
    if (st == CN_PENDING) {
        REQUIRE(op != 0 && op != 77, "CN_PENDING with op %llu", (unsigned long long)op);
        REQUIRE(name == NULL, "CN_PENDING and a name in *channel");
        REQUIRE(hq_await(&Q, op, MS(10000), &g) == 1, "no result for the pending new_channel");
        REQUIRE(g.status == CN_OK && g.has_text && is_process_channel_name(g.text) &&
                    g.closure == TAG && g.data == NULL,
                "pending new_channel result: status %d text \"%.200s\" closure %p", (int)g.status,
                g.text, g.closure);
    } else {
        REQUIRE(st == CN_OK && name != NULL && is_process_channel_name(name) && op == 0,
                "first cn_new_channel: %d (%s), op %llu", (int)st, cn_last_error(),
                (unsigned long long)op);
        cn_free(name);
        name = NULL;
    }
    op = 77;
    EXPECT_OK(cn_new_channel(c, NULL, Q.q, TAG, &name, &op));
    REQUIRE(op == 0, "a new_channel that finished at once left op %llu", (unsigned long long)op);
    REQUIRE(name != NULL && is_process_channel_name(name), "second new_channel name \"%s\"",
            name ? name : "(NULL)");
    REQUIRE(queue_idle(&Q, 50), "an operation that finished at once queued a result");
    ok = 1;
out:
    cn_free(name);
    hq_got_clear(&g);
    return ok;
}

static int check_new_channel_first(char *why) {
    return new_channel_first(A, why) && new_channel_first(B, why);
}

static int check_connect_no_server(char *why) {
    cn_client c = 77;
    hq_got g;
    int ok = 0;
    /* port 1 on loopback refuses at once; the password must not show in the error */
    static const char cfg[] = "{\"servers\": [\"nats://ctuser:s3cr3tpw@127.0.0.1:1\"], "
                              "\"connect_deadline\": 1, \"connect_options\": {\"connect_timeout\": 1}}";
    hq_got_init(&g);
    EXPECT_FAIL(cn_connect(cfg, NULL, NULL, 0, NULL, &c), CN_INVALID_HANDLE); /* no queue */
    REQUIRE(c == 0, "a refused connect left the handle %llu", (unsigned long long)c);
    EXPECT_ST(cn_connect(cfg, NULL, NULL, Q.q, TAG, &c), CN_PENDING);
    REQUIRE(c != 0, "no handle with CN_PENDING");
    REQUIRE(hq_await(&Q, c, MS(10000), &g) == 1, "no connect result within 10 s");
    REQUIRE(g.status == CN_NO_SERVER, "connect result %d (%s), want CN_NO_SERVER", (int)g.status,
            cn_status_text(g.status));
    REQUIRE(g.closure == TAG, "closure %p, want %p", g.closure, TAG);
    REQUIRE(g.has_text && g.text[0] && strstr(g.text, "s3cr3tpw") == NULL,
            "result text empty or shows the password: \"%.200s\"", g.text);
    /* "if the connect fails, later calls return CN_CLOSED" */
    EXPECT_FAIL(cn_flush(c), CN_CLOSED);
    EXPECT_FAIL(cn_close(c, Q.q, NULL), CN_CLOSED);
    ok = 1;
out:
    hq_got_clear(&g);
    return ok;
}

static int check_new_channel(char *why) {
    char *name = NULL, *name2 = NULL;
    int ok = 0;
    EXPECT_OK(cn_new_channel(A, NULL, Q.q, NULL, &name, NULL));
    REQUIRE(name != NULL, "*channel is NULL after CN_OK");
    REQUIRE(is_process_channel_name(name), "name \"%s\" is not specific.<12 hex>!<32 hex>", name);
    EXPECT_OK(cn_new_channel(A, "", Q.q, NULL, &name2, NULL));
    REQUIRE(name2 != NULL && is_process_channel_name(name2), "second name \"%s\"",
            name2 ? name2 : "(NULL)");
    REQUIRE(strncmp(name, name2, 22) == 0, "names of one client differ before '!': %s %s", name,
            name2);
    REQUIRE(strcmp(name, name2) != 0, "two new channels have the same name %s", name);
    cn_free(name2);
    name2 = NULL;
    /* another prefix needs its own process subscription: at once or pending */
    {
        char custom[128];
        cn_op op = 0;
        hq_got g;
        cn_status st = cn_new_channel(A, "custom", Q.q, NULL, &name2, &op);
        hq_got_init(&g);
        custom[0] = '\0';
        if (st == CN_OK && name2 != NULL) {
            snprintf(custom, sizeof custom, "%s", name2);
        } else if (hq_settle(&Q, st, op, MS(10000), &g) == CN_OK && g.has_text) {
            snprintf(custom, sizeof custom, "%.120s", g.text);
        }
        hq_got_clear(&g);
        REQUIRE(strncmp(custom, "custom.", 7) == 0 && strchr(custom, '!') != NULL,
                "prefix \"custom\" gave \"%s\" (status %d)", custom, (int)st);
    }
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
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 77;
    int ok = 0;
    EXPECT_OK(new_channel(A, ch1, sizeof ch1));
    EXPECT_OK(new_channel(A, ch2, sizeof ch2));
    EXPECT_OK(cn_send(B, ch1, x.data, x.len, Q.q, TAG, &op));
    REQUIRE(op == 0, "a send accepted at once left op %llu", (unsigned long long)op);
    EXPECT_OK(cn_send(B, ch2, y.data, y.len, Q.q, TAG, NULL)); /* op may be NULL */
    /* ch1 and ch2 share A's process subscription and one dispatcher: once y arrived, x has too */
    EXPECT_ST(recv_msg(A, ch2, 5000, &m, NULL), CN_OK);
    REQUIRE(msg_is(&m, &y), "ch2 body differs from what was sent (len %zu vs %zu)", m.len, y.len);
    op = 77;
    EXPECT_OK(cn_receive(A, ch1, Q.q, TAG, &body, &len, &op));
    REQUIRE(op == 0, "a receive that finished at once left op %llu", (unsigned long long)op);
    REQUIRE(bytes_are(body, len, &x), "immediate body differs (len %zu vs %zu)", len, x.len);
    REQUIRE(queue_idle(&Q, 50), "an operation that finished at once queued a result");
    ok = 1;
out:
    msg_free(&m);
    return ok;
}

static int check_pending_receive(char *why) {
    char ch[128];
    body_t x = body_of("pending-x");
    const uint8_t *body = NULL;
    size_t len = 77;
    cn_op op = 0;
    hq_got g;
    int ok = 0;
    hq_got_init(&g);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    REQUIRE(queue_idle(&Q, 0), "the main queue is not empty");
    EXPECT_ST(cn_receive(A, ch, Q.q, TAG, &body, &len, &op), CN_PENDING);
    REQUIRE(op != 0, "CN_PENDING without an op handle");
    REQUIRE(body == NULL && len == 0, "CN_PENDING with a body (%zu bytes)", len);
    REQUIRE(cn_last_error()[0] == '\0', "cn_last_error() is \"%s\" after CN_PENDING", cn_last_error());
    REQUIRE(!hq_readable(Q.rd, MS(20)), "notify readable before anything was sent");
    EXPECT_OK(send_msg(B, ch, &x));
    REQUIRE(hq_readable(Q.rd, MS(5000)), "no notify byte within 5 s of the send");
    REQUIRE(hq_await(&Q, op, MS(5000), &g) == 1, "notify byte but no result");
    REQUIRE(g.op == op && g.closure == TAG, "result op %llu closure %p, want %llu %p",
            (unsigned long long)g.op, g.closure, (unsigned long long)op, TAG);
    REQUIRE(g.status == CN_OK && !g.has_text, "result status %d (%s), text \"%.200s\"", (int)g.status,
            cn_status_text(g.status), g.text);
    REQUIRE(got_is(&g, &x), "result body differs (len %zu vs %zu)", g.len, x.len);
    /* the next take makes the result final: cn_cancel can no longer give it back */
    REQUIRE(queue_idle(&Q, 0), "more than one result for one receive");
    EXPECT_FAIL(cn_cancel(A, op), CN_NOT_PENDING);
    ok = 1;
out:
    hq_got_clear(&g);
    return ok;
}

/* Starting a receive over (cn_receive with channel NULL and *op set): a receive whose result the
   last take handed over waits again as the same op, with the same closure, and its next message
   comes under that op; after the next take it can no longer start over. */
static int check_receive_again(char *why) {
    char ch[128];
    body_t x = body_of("again-x"), y = body_of("again-y");
    const uint8_t *body = NULL;
    size_t len = 77;
    cn_op op = 0, again = 0;
    hq_got g;
    int ok = 0;
    hq_got_init(&g);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    REQUIRE(queue_idle(&Q, 0), "the main queue is not empty");
    EXPECT_ST(cn_receive(A, ch, Q.q, TAG, &body, &len, &op), CN_PENDING);
    EXPECT_OK(send_msg(B, ch, &x));
    REQUIRE(hq_await(&Q, op, MS(5000), &g) == 1 && got_is(&g, &x), "no result with the first message");
    hq_got_clear(&g);
    again = op;
    EXPECT_ST(cn_receive(A, NULL, Q.q, NULL, &body, &len, &again), CN_PENDING);
    REQUIRE(again == op, "*op %llu after a start-over, want %llu", (unsigned long long)again,
            (unsigned long long)op);
    REQUIRE(body == NULL && len == 0, "CN_PENDING with a body (%zu bytes)", len);
    EXPECT_OK(send_msg(B, ch, &y));
    REQUIRE(hq_await(&Q, op, MS(5000), &g) == 1, "no result for the receive that started over");
    REQUIRE(g.op == op && g.closure == TAG && g.status == CN_OK, "result op %llu closure %p status %d",
            (unsigned long long)g.op, g.closure, (int)g.status);
    REQUIRE(got_is(&g, &y), "second result body differs (len %zu vs %zu)", g.len, y.len);
    REQUIRE(queue_idle(&Q, 0), "more than one result for one receive");
    again = op;
    EXPECT_FAIL(cn_receive(A, NULL, Q.q, NULL, &body, &len, &again), CN_NOT_PENDING);
    REQUIRE(again == 0, "*op %llu after a refused start-over, want 0", (unsigned long long)again);
    ok = 1;
out:
    hq_got_clear(&g);
    return ok;
}

/* One byte per empty-to-non-empty: a result queued into a non-empty queue writes none, and the
   results one group message makes together (three waiting members) are signalled once, after
   the last of them is queued. */
static int check_notify_bytes(char *why) {
    char ch[3][128], gch[3][128], group[64];
    body_t x[3], g = body_of("burst");
    hq_t q2, q3;
    cn_result res[8];
    const uint8_t *body = NULL;
    size_t len = 0, count = 0;
    cn_op op[3] = {0, 0, 0}, gop[3] = {0, 0, 0};
    int ok = 0, i, bytes, added = 0;
    char text[32];
    hq_init(&q2);
    hq_init(&q3);
    snprintf(group, sizeof group, "burst%ld", (long)getpid());
    for (i = 0; i < 3; i++) {
        snprintf(text, sizeof text, "notify-%d", i);
        x[i] = body_of(text);
        EXPECT_OK(new_channel(A, ch[i], sizeof ch[i]));
        EXPECT_OK(new_channel(A, gch[i], sizeof gch[i]));
    }
    EXPECT_OK(hq_open(&q2));
    EXPECT_OK(hq_open(&q3));
    EXPECT_ST(cn_receive(A, ch[0], q2.q, NULL, &body, &len, &op[0]), CN_PENDING);
    EXPECT_ST(cn_receive(A, ch[1], q2.q, NULL, &body, &len, &op[1]), CN_PENDING);
    EXPECT_ST(cn_receive(A, ch[2], q3.q, NULL, &body, &len, &op[2]), CN_PENDING);
    EXPECT_OK(send_msg(B, ch[0], &x[0]));
    REQUIRE(hq_readable(q2.rd, MS(5000)), "no notify byte for the first result");
    sleep_ms(50);
    REQUIRE((bytes = hq_drain(q2.rd)) == 1, "%d notify bytes for one result", bytes);
    /* q2 holds a result nobody took: the next one writes no byte. A's process channels share one
       dispatcher, so once q3 has the result of the message sent after, q2 has its second. */
    EXPECT_OK(send_msg(B, ch[1], &x[1]));
    EXPECT_OK(send_msg(B, ch[2], &x[2]));
    REQUIRE(hq_readable(q3.rd, MS(5000)), "no notify byte on the other queue");
    REQUIRE(!hq_readable(q2.rd, 0), "a byte for a result queued into a non-empty queue");
    REQUIRE(hq_take(&q2, res, 8, 0) == 2, "q2 does not hold the two results");
    REQUIRE(res[0].op == op[0] && res[1].op == op[1], "results out of order: ops %llu %llu",
            (unsigned long long)res[0].op, (unsigned long long)res[1].op);
    REQUIRE(bytes_are(res[0].data, res[0].len, &x[0]) && bytes_are(res[1].data, res[1].len, &x[1]),
            "q2's results carry other bodies");
    REQUIRE(hq_take(&q3, res, 8, 0) == 1 && res[0].op == op[2] &&
                bytes_are(res[0].data, res[0].len, &x[2]),
            "q3 does not hold its result");
    op[0] = op[1] = op[2] = 0;

    /* the burst */
    for (i = 0; i < 3; i++) {
        EXPECT_OK(group_add(A, group, gch[i]));
        added = i + 1;
    }
    for (i = 0; i < 3; i++) {
        EXPECT_ST(cn_receive(A, gch[i], q2.q, NULL, &body, &len, &gop[i]), CN_PENDING);
    }
    REQUIRE(!hq_readable(q2.rd, 0), "a notify byte before the group message");
    EXPECT_OK(group_send(B, group, &g));
    REQUIRE(hq_readable(q2.rd, MS(5000)), "no notify byte for the group message");
    EXPECT_OK(cn_queue_take(q2.q, res, 8, &count));
    REQUIRE(count == 3, "%zu results queued when the byte came, want all 3", count);
    sleep_ms(100); /* a second byte would be written by now */
    REQUIRE((bytes = hq_drain(q2.rd)) == 1, "%d notify bytes for one group message", bytes);
    for (i = 0; i < 3; i++) {
        REQUIRE(res[i].status == CN_OK && bytes_are(res[i].data, res[i].len, &g),
                "member result %d: status %d len %zu", i, (int)res[i].status, res[i].len);
    }
    gop[0] = gop[1] = gop[2] = 0;
    ok = 1;
out:
    for (i = 0; i < added; i++) {
        cn_group_discard(A, group, gch[i]);
    }
    hq_close(&q2); /* withdraws what still waits */
    hq_close(&q3);
    return ok;
}

/* Lent memory: a body lent by cn_receive with one queue stays valid across a receive and a take
   with another queue (only the next take or receive with its own queue releases it), and all
   results of one take stay valid together, also across a take of another queue. */
static int check_lent_bodies(char *why) {
    char ch[128], ch2[128], ch3[128], mark[128];
    body_t xy[2], a = body_of("lent-a"), b = body_of("lent-b"), mk = body_of("lent-mark");
    hq_t q1, q2;
    cn_result res[4], res2[4];
    const uint8_t *p1 = NULL, *p2 = NULL, *body = NULL;
    size_t l1 = 0, l2 = 0, len = 0, count = 0;
    cn_op op = 0;
    int ok = 0;
    hq_init(&q1);
    hq_init(&q2);
    xy[0] = body_of("lent-x");
    xy[1] = body_of("lent-y");
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(A, ch2, sizeof ch2));
    EXPECT_OK(new_channel(A, ch3, sizeof ch3));
    EXPECT_OK(new_channel(A, mark, sizeof mark));
    EXPECT_OK(hq_open(&q1));
    EXPECT_OK(hq_open(&q2));
    EXPECT_OK(send_and_settle(ch, mark, xy, 2));
    EXPECT_OK(cn_receive(A, ch, q1.q, NULL, &p1, &l1, &op));
    REQUIRE(bytes_are(p1, l1, &xy[0]), "the first receive did not lend x");
    EXPECT_OK(cn_receive(A, ch, q2.q, NULL, &p2, &l2, &op));
    REQUIRE(bytes_are(p2, l2, &xy[1]), "the second receive did not lend y");
    REQUIRE(bytes_are(p1, l1, &xy[0]), "a receive with another queue changed q1's lent body");
    EXPECT_OK(cn_queue_take(q2.q, res2, 4, &count)); /* releases p2, not p1 */
    REQUIRE(bytes_are(p1, l1, &xy[0]), "a take of another queue changed q1's lent body");
    p1 = NULL; /* the next receive with q1 releases it */

    EXPECT_ST(cn_receive(A, ch2, q1.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_ST(cn_receive(A, ch3, q1.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_ST(cn_receive(A, mark, q2.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_OK(send_msg(B, ch2, &a));
    EXPECT_OK(send_msg(B, ch3, &b));
    EXPECT_OK(send_msg(B, mark, &mk));
    /* one dispatcher: once q2 has the marker, q1 has both results */
    REQUIRE(hq_take(&q2, res2, 4, MS(5000)) == 1 && bytes_are(res2[0].data, res2[0].len, &mk),
            "q2 did not get the marker");
    REQUIRE(hq_take(&q1, res, 4, 0) == 2, "q1 does not hold both results");
    REQUIRE(bytes_are(res[0].data, res[0].len, &a) && bytes_are(res[1].data, res[1].len, &b),
            "the two results of one take are not both valid");
    REQUIRE(bytes_are(res2[0].data, res2[0].len, &mk), "a take of q1 changed q2's lent result");
    ok = 1;
out:
    hq_close(&q1);
    hq_close(&q2);
    return ok;
}

/* ---- messages, channels and groups -------------------------------------------------------- */

static int check_plain_channel_shared(char *why) {
    char plain[64], group[64];
    body_t x = body_of("plain-work");
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op opa = 0, opb = 0;
    hq_got g;
    int ok = 0;
    hq_got_init(&g);
    snprintf(plain, sizeof plain, "work.q%ld", (long)getpid());
    snprintf(group, sizeof group, "confirm%ld", (long)getpid());
    EXPECT_ST(cn_receive(A, plain, Q.q, NULL, &body, &len, &opa), CN_PENDING);
    EXPECT_ST(cn_receive(B, plain, Q.q, NULL, &body, &len, &opb), CN_PENDING);
    /* A pending receive confirms its subscription in the background. A group_add of the same
       plain channel finishes only once that channel's subscription is confirmed (S1), so after it
       both clients are surely subscribed; the membership is discarded again. */
    EXPECT_OK(group_add(A, group, plain));
    EXPECT_OK(group_add(B, group, plain));
    EXPECT_OK(cn_group_discard(A, group, plain));
    EXPECT_OK(cn_group_discard(B, group, plain));
    EXPECT_OK(send_msg(A, plain, &x));
    REQUIRE(hq_await(&Q, 0, MS(5000), &g) == 1, "no receive completed within 5 s");
    REQUIRE(g.op == opa || g.op == opb, "a result of op %llu, not of the receives",
            (unsigned long long)g.op);
    REQUIRE(g.status == CN_OK && got_is(&g, &x), "completed receive: status %d, len %zu",
            (int)g.status, g.len);
    REQUIRE(queue_idle(&Q, 300), "two receives completed for one send");
    /* the other one is still pending and can be withdrawn */
    if (g.op == opa) {
        EXPECT_OK(cn_cancel(B, opb));
    } else {
        EXPECT_OK(cn_cancel(A, opa));
    }
    opa = opb = 0;
    ok = 1;
out:
    if (opa) {
        cn_cancel(A, opa);
    }
    if (opb) {
        cn_cancel(B, opb);
    }
    hq_got_clear(&g);
    return ok;
}

static int check_group_fanout(char *why, char *ch1, char *ch2, const char *group) {
    body_t g = body_of("group-fanout");
    msg_t m1 = {NULL, 0}, m2 = {NULL, 0};
    int ok = 0;
    EXPECT_OK(new_channel(A, ch1, 128));
    EXPECT_OK(new_channel(A, ch2, 128));
    EXPECT_OK(group_add(A, group, ch1));
    EXPECT_OK(group_add(A, group, ch2));
    EXPECT_OK(group_add(A, group, ch2)); /* twice is not an error */
    EXPECT_OK(group_send(B, group, &g));
    EXPECT_ST(recv_msg(A, ch1, 5000, &m1, NULL), CN_OK);
    EXPECT_ST(recv_msg(A, ch2, 5000, &m2, NULL), CN_OK);
    REQUIRE(msg_is(&m1, &g), "member 1 got a different body");
    REQUIRE(msg_is(&m2, &g), "member 2 got a different body");
    /* a group without members is not an error */
    EXPECT_OK(group_send(B, "nobody-here", &g));
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
    EXPECT_OK(group_add(A, group, cha));
    EXPECT_OK(group_add(B, group, chb));
    EXPECT_OK(group_send(A, group, &g));
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
    EXPECT_OK(group_send(B, group, &g));
    /* Sent after the group message by the same connection: if ch2 were still a member, the group
       message would be first in ch2's mailbox (S10). */
    EXPECT_OK(send_msg(B, ch2, &mark));
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

/* ---- cancel and queue_free ----------------------------------------------------------------- */

/* A waiting receive withdrawn before any message: no result ever comes, the message goes to the
   next receive. */
static int check_cancel_waiting_receive(char *why) {
    char ch[128];
    body_t x = body_of("cancelled-receive-keeps-this");
    msg_t m = {NULL, 0};
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    int ok = 0;
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_ST(cn_receive(A, ch, Q.q, NULL, &body, &len, &op), CN_PENDING);
    REQUIRE(op != 0, "CN_PENDING without an op handle");
    EXPECT_OK(cn_cancel(A, op));
    EXPECT_FAIL(cn_cancel(A, op), CN_NOT_PENDING); /* withdrawn before */
    EXPECT_OK(send_msg(B, ch, &x));
    EXPECT_ST(recv_msg(A, ch, 5000, &m, NULL), CN_OK);
    REQUIRE(msg_is(&m, &x), "the later receive got a different body");
    REQUIRE(queue_idle(&Q, 100), "a result came for the cancelled receive");
    EXPECT_FAIL(cn_cancel(A, 0), CN_INVALID_HANDLE);
    ok = 1;
out:
    msg_free(&m);
    return ok;
}

/* A receive's result waiting in the queue, withdrawn before anyone took it: the take skips it,
   and the message is back in the mailbox. */
static int check_cancel_queued_result(char *why) {
    char ch[128];
    body_t x = body_of("queued-then-cancelled");
    msg_t m = {NULL, 0};
    hq_t qc;
    cn_result res[4];
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    int ok = 0, immediate = 0;
    hq_init(&qc);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(hq_open(&qc));
    EXPECT_ST(cn_receive(A, ch, qc.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_OK(send_msg(B, ch, &x));
    REQUIRE(hq_readable(qc.rd, MS(5000)), "the result was not queued within 5 s");
    EXPECT_OK(cn_cancel(A, op));
    REQUIRE(hq_take(&qc, res, 4, 0) == 0, "the take handed over a withdrawn result");
    EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
    REQUIRE(immediate && msg_is(&m, &x), "the message did not go back to the mailbox");
    ok = 1;
out:
    msg_free(&m);
    hq_close(&qc);
    return ok;
}

/* A result the host took is given back with cn_cancel until the queue's next take: the message
   goes back to the FRONT of its mailbox (before one that arrived after it). After the next
   take it is kept for good. */
static int check_cancel_taken_result(char *why) {
    char ch[128], mark[128];
    body_t xy[2], z = body_of("taken-and-kept");
    msg_t m = {NULL, 0};
    hq_t qc;
    cn_result res[4];
    const uint8_t *body = NULL;
    size_t len = 0, count = 0;
    cn_op op = 0, op2 = 0;
    int ok = 0, immediate = 0;
    hq_init(&qc);
    xy[0] = body_of("taken-x");
    xy[1] = body_of("taken-y");
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(A, mark, sizeof mark));
    EXPECT_OK(hq_open(&qc));
    EXPECT_ST(cn_receive(A, ch, qc.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_OK(send_and_settle(ch, mark, xy, 2)); /* x to the receive, y waits in the mailbox */
    REQUIRE(hq_take(&qc, res, 4, MS(5000)) == 1, "no result for the receive");
    REQUIRE(res[0].op == op && bytes_are(res[0].data, res[0].len, &xy[0]),
            "the receive did not get x");
    EXPECT_OK(cn_cancel(A, op)); /* the consumer went away after the result reached it */
    EXPECT_FAIL(cn_cancel(A, op), CN_NOT_PENDING);
    EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
    REQUIRE(immediate && msg_is(&m, &xy[0]), "x did not come back to the front of the mailbox");
    msg_free(&m);
    EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
    REQUIRE(immediate && msg_is(&m, &xy[1]), "y did not follow the given-back x");
    msg_free(&m);

    EXPECT_ST(cn_receive(A, ch, qc.q, NULL, &body, &len, &op2), CN_PENDING);
    EXPECT_OK(send_msg(B, ch, &z));
    REQUIRE(hq_take(&qc, res, 4, MS(5000)) == 1 && res[0].op == op2, "no result for the receive");
    EXPECT_OK(cn_queue_take(qc.q, res, 4, &count)); /* the next take: the result is kept */
    EXPECT_FAIL(cn_cancel(A, op2), CN_NOT_PENDING);
    EXPECT_ST(recv_msg(A, ch, 200, &m, NULL), CN_TIMEOUT);
    ok = 1;
out:
    msg_free(&m);
    hq_close(&qc);
    return ok;
}

/* cn_queue_free with a receive waiting: withdrawn, so the message sent afterwards is received
   later through another queue; the freed queue is never signalled and its handle is refused. */
static int check_queue_free_pending_receive(char *why) {
    char ch[128];
    body_t x = body_of("after-queue-free");
    msg_t m = {NULL, 0};
    hq_t qf;
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_queue freed;
    cn_op op = 0;
    int ok = 0;
    hq_init(&qf);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(hq_open(&qf));
    EXPECT_ST(cn_receive(A, ch, qf.q, NULL, &body, &len, &op), CN_PENDING);
    freed = qf.q;
    qf.q = 0;
    EXPECT_OK(cn_queue_free(freed));
    EXPECT_FAIL(cn_cancel(A, op), CN_NOT_PENDING);
    EXPECT_FAIL(cn_receive(A, ch, freed, NULL, &body, &len, &op), CN_INVALID_HANDLE);
    EXPECT_OK(send_msg(B, ch, &x));
    EXPECT_ST(recv_msg(A, ch, 5000, &m, NULL), CN_OK);
    REQUIRE(msg_is(&m, &x), "the message was not received through the other queue");
    REQUIRE(!hq_readable(qf.rd, MS(100)), "a freed queue was signalled");
    ok = 1;
out:
    msg_free(&m);
    hq_close(&qf);
    return ok;
}

/* cn_queue_free with a received message nobody took: it goes back to its mailbox. */
static int check_queue_free_untaken_result(char *why) {
    char ch[128];
    body_t x = body_of("untaken-result");
    msg_t m = {NULL, 0};
    hq_t qf;
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    int ok = 0, immediate = 0;
    hq_init(&qf);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(hq_open(&qf));
    EXPECT_ST(cn_receive(A, ch, qf.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_OK(send_msg(B, ch, &x));
    REQUIRE(hq_readable(qf.rd, MS(5000)), "the result was not queued within 5 s");
    EXPECT_OK(cn_queue_free(qf.q));
    qf.q = 0;
    EXPECT_ST(recv_msg(A, ch, 5000, &m, &immediate), CN_OK);
    REQUIRE(immediate && msg_is(&m, &x), "the untaken message did not go back to the mailbox");
    ok = 1;
out:
    msg_free(&m);
    hq_close(&qf);
    return ok;
}

/* cn_queue_free of the queue a connect in progress reports to: the client is closed. */
static int check_queue_free_abandons_connect(char *why) {
    char cfg[256];
    hq_t qc;
    cn_client c = 0;
    cn_status st = CN_OK;
    long deadline;
    int ok = 0, port = 0, fd, i;
    hq_init(&qc);
    fd = silent_listener(&port);
    REQUIRE(fd >= 0, "cannot open a listener: %s", strerror(errno));
    silent_config(cfg, sizeof cfg, port);
    EXPECT_OK(hq_open(&qc));
    EXPECT_ST(cn_connect(cfg, NULL, NULL, qc.q, NULL, &c), CN_PENDING);
    EXPECT_FAIL(cn_flush(c), CN_ILLEGAL_STATE);
    EXPECT_OK(cn_queue_free(qc.q));
    qc.q = 0;
    deadline = hq_now_ms() + MS(5000);
    for (i = 0; i < 1000 && hq_now_ms() < deadline; i++) {
        if ((st = cn_flush(c)) == CN_CLOSED) {
            break;
        }
        sleep_ms(10);
    }
    REQUIRE(st == CN_CLOSED, "the client of the freed queue is not closed after 5 s: %d (%s)",
            (int)st, cn_status_text(st));
    REQUIRE(!hq_readable(qc.rd, MS(100)), "a freed queue was signalled");
    c = 0;
    ok = 1;
out:
    if (c != 0 && qc.q != 0) {
        cn_close(c, qc.q, NULL);
    }
    hq_close(&qc);
    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

/* ---- backpressure: a send that waits for room in the outbound buffer ----------------------- */

#define BIG_SENDS 20
#define BIG_PAD 4096

/* {"type": "ctest", "text": "big-<i>", "pad": <BIG_PAD bytes>} into buf; returns its length. */
static size_t big_body(uint8_t *buf, size_t cap, int i) {
    char text[32];
    size_t n;
    snprintf(text, sizeof text, "big-%d", i);
    n = make_body(buf, cap, text);
    if (cap < n + 8 + BIG_PAD) {
        abort();
    }
    buf[0] = 0x83; /* three pairs */
    buf[n++] = 0xa3;
    memcpy(buf + n, "pad", 3);
    n += 3;
    buf[n++] = 0xc5; /* bin 16 */
    buf[n++] = (uint8_t)(BIG_PAD >> 8);
    buf[n++] = (uint8_t)(BIG_PAD & 0xff);
    memset(buf + n, 'a' + i % 26, BIG_PAD);
    return n + BIG_PAD;
}

/* A client whose outbound buffer holds 1024 bytes: a message is always accepted into an empty
   buffer, so several 4 KiB sends back to back find it full and go CN_PENDING; each completes
   CN_OK once accepted, and every message arrives, in order. */
static int check_send_pending(char *why) {
    char cfg[512], ch[128];
    static uint8_t buf[BIG_PAD + 128];
    cn_client p = 0;
    cn_op ops[BIG_SENDS];
    hq_t qp;
    hq_got g;
    msg_t m = {NULL, 0};
    size_t n;
    int ok = 0, i, pending = 0;
    cn_status st;
    hq_init(&qp);
    hq_got_init(&g);
    config_json(cfg, sizeof cfg, NULL, "\"pending_size\": 1024");
    EXPECT_OK(connect_on(&Q, cfg, NULL, NULL, &p));
    EXPECT_OK(hq_open(&qp));
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    for (i = 0; i < BIG_SENDS; i++) {
        n = big_body(buf, sizeof buf, i);
        ops[i] = 77;
        st = cn_send(p, ch, buf, n, qp.q, (void *)(uintptr_t)(i + 1), &ops[i]);
        REQUIRE(st == CN_OK || st == CN_PENDING, "send %d: %d (%s): %s", i, (int)st,
                cn_status_text(st), cn_last_error());
        REQUIRE(i > 0 || st == CN_OK, "the first send into an empty buffer went pending");
        if (st == CN_PENDING) {
            REQUIRE(ops[i] != 0 && ops[i] != 77, "CN_PENDING with op %llu", (unsigned long long)ops[i]);
            pending++;
        } else {
            REQUIRE(ops[i] == 0, "a send accepted at once left op %llu", (unsigned long long)ops[i]);
        }
    }
    REQUIRE(pending > 0, "no send of %d went CN_PENDING with a 1024-byte outbound buffer", BIG_SENDS);
    for (i = 0; i < BIG_SENDS; i++) {
        if (ops[i] == 0) {
            continue;
        }
        REQUIRE(hq_await(&qp, ops[i], MS(15000), &g) == 1, "no result for pending send %d", i);
        REQUIRE(g.status == CN_OK && g.closure == (void *)(uintptr_t)(i + 1) && !g.has_text &&
                    g.data == NULL && g.len == 0,
                "pending send %d: status %d (%s) closure %p text \"%s\"", i, (int)g.status,
                cn_status_text(g.status), g.closure, g.text);
    }
    for (i = 0; i < BIG_SENDS; i++) {
        n = big_body(buf, sizeof buf, i);
        EXPECT_ST(recv_msg(A, ch, 5000, &m, NULL), CN_OK);
        REQUIRE(m.len == n && memcmp(m.data, buf, n) == 0,
                "message %d is not big-%d (len %zu vs %zu): lost or out of order", i, i, m.len, n);
        msg_free(&m);
    }
    EXPECT_OK(close_on(&Q, p, NULL));
    p = 0;
    printf("     (%d of %d sends went CN_PENDING)\n", pending, BIG_SENDS);
    ok = 1;
out:
    if (p != 0) {
        close_on(&Q, p, NULL);
    }
    msg_free(&m);
    hq_got_clear(&g);
    hq_close(&qp);
    return ok;
}

/* ---- stats, flush, errors ------------------------------------------------------------------ */

static int check_stats(char *why) {
    char *json = NULL;
    int ok = 0;
    EXPECT_OK(cn_stats(A, &json));
    REQUIRE(json != NULL, "CN_OK without *json");
    REQUIRE(json[0] == '{', "stats is not a JSON object: %.80s", json);
    REQUIRE(strstr(json, "\"published\"") != NULL, "no \"published\" in %.200s", json);
    REQUIRE(strstr(json, "\"delivered\"") != NULL, "no \"delivered\" in %.200s", json);
    REQUIRE(strstr(json, "\"client_id\"") != NULL, "no \"client_id\" in %.200s", json);
    REQUIRE(strstr(json, "\"goroutines\"") != NULL, "no \"goroutines\" in %.200s", json);
    cn_free(json);
    json = NULL;
    /* B published every test message so far */
    EXPECT_OK(cn_stats(B, &json));
    REQUIRE(strstr(json, "\"published\":0,") == NULL, "B published nothing? %.200s", json);
    REQUIRE(stats_number(B, "\"published\":") > 0, "no number for B's \"published\"");
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
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    cn_client c = 0;
    hq_got r;
    int ok = 0;
    hq_got_init(&r);
    snprintf(group, sizeof group, "flushgrp%ld", (long)getpid());
    EXPECT_OK(connect_client(&c)); /* a client of its own: flush resets all its state */
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    EXPECT_OK(new_channel(c, ch2, sizeof ch2));
    EXPECT_OK(group_add(c, group, ch2));
    /* old is queued in ch2's mailbox once the marker sent after it reached ch (S10) */
    EXPECT_ST(cn_receive(c, ch, Q.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_OK(send_msg(B, ch2, &old));
    EXPECT_OK(send_msg(B, ch, &mark));
    REQUIRE(hq_await(&Q, op, MS(5000), &r) == 1 && got_is(&r, &mark),
            "pending receive did not get the marker");
    EXPECT_ST(cn_receive(c, ch, Q.q, NULL, &body, &len, &op), CN_PENDING);

    EXPECT_OK(cn_flush(c));

    EXPECT_OK(cn_stats(c, &json));
    REQUIRE(json && strstr(json, "\"groups\":0") != NULL, "groups left after flush: %.300s",
            json ? json : "(NULL)");
    /* the receive waiting across the flush keeps waiting and gets what is sent now */
    EXPECT_OK(send_msg(B, ch, &x));
    REQUIRE(hq_await(&Q, op, MS(5000), &r) == 1, "the receive waiting across flush got nothing");
    REQUIRE(r.status == CN_OK && got_is(&r, &x), "receive across flush: status %d", (int)r.status);
    /* the queued message is gone, and so is the membership */
    EXPECT_ST(cn_receive(c, ch2, Q.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_OK(group_send(B, group, &g));
    EXPECT_OK(send_msg(B, ch2, &mark2));
    REQUIRE(hq_await(&Q, op, MS(5000), &r) == 1, "receive on ch2 after flush got nothing");
    REQUIRE(r.status == CN_OK && got_is(&r, &mark2),
            "after flush ch2 got \"%.*s\" before the marker (status %d)",
            (int)(r.len > 60 ? 60 : r.len), r.data ? (const char *)r.data : "", (int)r.status);
    EXPECT_OK(cn_flush(c));
    EXPECT_OK(close_on(&Q, c, NULL));
    c = 0;
    ok = 1;
out:
    cn_free(json);
    if (c != 0) {
        close_on(&Q, c, NULL); /* ends a receive still waiting */
    }
    hq_got_clear(&r);
    return ok;
}

static void *thread_last_error(void *arg) {
    const char **out = arg;
    *out = cn_last_error();
    return NULL;
}

static int check_errors(char *why) {
    char ch[128], chb[128], cfg[512], *name = NULL, *json = NULL;
    body_t x = body_of("errors");
    const uint8_t *body = NULL;
    uint8_t *big = NULL;
    size_t len = 0;
    cn_client c = 0;
    cn_queue freed = 0;
    cn_op op = 0;
    int ok = 0;
    /* msgpack bodies that are not Channels messages */
    static const uint8_t array_body[] = {0x91, 0x01};                      /* [1] */
    static const uint8_t int_key_body[] = {0x81, 0x01, 0x02};              /* {1: 2} */
    static const uint8_t trailing_body[] = {0x80, 0x00};                   /* {} then a byte */
    static const uint8_t truncated_body[] = {0x81, 0xa1};                  /* {"<cut>" */
    static const uint8_t reserved_body[] = {0x81, 0xb0, '_', '_', 'a', 's', 'g', 'i', '_', 'c',
                                            'h', 'a', 'n', 'n', 'e', 'l', '_', '_', 0xa1, 'x'};
    const cn_queue q = Q.q;
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    EXPECT_OK(new_channel(B, chb, sizeof chb));

    /* NULL arguments */
    EXPECT_FAIL(cn_connect(NULL, NULL, NULL, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_send(A, NULL, x.data, x.len, q, NULL, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_send(A, ch, NULL, x.len, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_send(A, NULL, x.data, x.len, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, ch, q, NULL, NULL, &len, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, ch, q, NULL, &body, NULL, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, NULL, q, NULL, &body, &len, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_new_channel(A, NULL, q, NULL, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_add(A, NULL, ch, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_add(A, "g", NULL, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_discard(A, NULL, ch), CN_INVALID_ARG);
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
    EXPECT_FAIL(cn_send(A, "specific.\xff\xfe", x.data, x.len, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_send(A, "gr\xc3", x.data, x.len, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_new_channel(A, "\xed\xa0\x80", q, NULL, &name, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_connect("{\"prefix\": \"\xff\"}", NULL, NULL, q, NULL, &c), CN_INVALID_ARG);
    EXPECT_FAIL(cn_receive(A, "work.\xc0\xaf", q, NULL, &body, &len, &op), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_add(A, "g\xff", ch, q, NULL, NULL), CN_INVALID_ARG);
    EXPECT_FAIL(cn_group_discard(A, "g", "ch\x80"), CN_INVALID_ARG);

    /* bad names */
    EXPECT_FAIL(cn_send(A, "bad name", x.data, x.len, q, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_send(A, "", x.data, x.len, q, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_send(A, "a..b", x.data, x.len, q, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_group_send(A, "bad*group", x.data, x.len, q, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_group_add(A, "g>", ch, q, NULL, NULL), CN_INVALID_NAME);
    EXPECT_FAIL(cn_group_discard(A, "ok", "bad name"), CN_INVALID_NAME);
    EXPECT_FAIL(cn_receive(A, "bad name", q, NULL, &body, &len, &op), CN_INVALID_NAME);
    EXPECT_FAIL(cn_new_channel(A, "bad prefix", q, NULL, &name, NULL), CN_INVALID_NAME);
    {
        char longname[128];
        memset(longname, 'a', 100);
        longname[100] = '\0';
        EXPECT_FAIL(cn_send(A, longname, x.data, x.len, q, NULL, NULL), CN_INVALID_NAME);
    }

    /* bad configuration: refused at once, nothing queued */
    EXPECT_FAIL(cn_connect("{not json", NULL, NULL, q, NULL, &c), CN_INVALID_CONFIG);
    EXPECT_FAIL(cn_connect("[1, 2]", NULL, NULL, q, NULL, &c), CN_INVALID_CONFIG);
    EXPECT_FAIL(cn_connect("{\"no_such_key\": 1}", NULL, NULL, q, NULL, &c), CN_INVALID_CONFIG);
    REQUIRE(strstr(cn_last_error(), "servers") != NULL,
            "unknown key: cn_last_error() does not list the known keys: %s", cn_last_error());
    EXPECT_FAIL(cn_connect("{\"capacity\": \"many\"}", NULL, NULL, q, NULL, &c), CN_INVALID_CONFIG);
    EXPECT_FAIL(cn_connect("{\"connect_options\": {\"pending_size\": -1}}", NULL, NULL, q, NULL, &c),
                CN_INVALID_CONFIG);
    REQUIRE(c == 0, "a refused connect left the handle %llu", (unsigned long long)c);

    /* bodies that are not Channels messages */
    EXPECT_FAIL(cn_send(A, ch, array_body, sizeof array_body, q, NULL, NULL), CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, int_key_body, sizeof int_key_body, q, NULL, NULL), CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, trailing_body, sizeof trailing_body, q, NULL, NULL),
                CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, truncated_body, sizeof truncated_body, q, NULL, NULL),
                CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_send(A, ch, reserved_body, sizeof reserved_body, q, NULL, NULL),
                CN_INVALID_MESSAGE);
    EXPECT_FAIL(cn_group_send(A, "g", array_body, sizeof array_body, q, NULL, NULL),
                CN_INVALID_MESSAGE);
    {
        cn_status st = cn_send(A, ch, x.data, 0, q, NULL, NULL); /* an empty body */
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
        EXPECT_FAIL(cn_send(A, ch, big, i + n, q, NULL, NULL), CN_MESSAGE_TOO_LARGE);
    }

    /* another client's process channel: receive and group_add refused, send works */
    EXPECT_FAIL(cn_receive(A, chb, q, NULL, &body, &len, &op), CN_FOREIGN_CHANNEL);
    EXPECT_FAIL(cn_group_add(A, "g", chb, q, NULL, NULL), CN_FOREIGN_CHANNEL);

    /* client and op handles the library never issued */
    EXPECT_FAIL(cn_send(0, ch, x.data, x.len, q, NULL, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_send((cn_client)1 << 60, ch, x.data, x.len, q, NULL, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_receive(0, ch, q, NULL, &body, &len, &op), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_new_channel(UINT64_MAX, NULL, q, NULL, &name, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_stats(987654321, &json), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_flush(0), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_close(0, q, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_cancel(0, 1), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_cancel(A, 0), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_group_discard((cn_client)1 << 62, "g", ch), CN_INVALID_HANDLE);

    /* queue handles: 0, never issued, freed; nothing is done, the client goes on */
    EXPECT_OK(cn_queue_new(-1, &freed));
    EXPECT_OK(cn_queue_free(freed));
    EXPECT_FAIL(cn_send(A, ch, x.data, x.len, 0, NULL, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_send(A, ch, x.data, x.len, freed, NULL, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_group_send(A, "g", x.data, x.len, (cn_queue)1 << 60, NULL, NULL),
                CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_receive(A, ch, 0, NULL, &body, &len, &op), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_new_channel(A, NULL, freed, NULL, &name, NULL), CN_INVALID_HANDLE);
    REQUIRE(name == NULL, "a refused cn_new_channel returned a name");
    EXPECT_FAIL(cn_group_add(A, "g", ch, freed, NULL, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_close(A, freed, NULL), CN_INVALID_HANDLE);
    EXPECT_FAIL(cn_close(A, 0, NULL), CN_INVALID_HANDLE);
    EXPECT_OK(cn_stats(A, &json)); /* A was not closed by the refused cn_close */
    cn_free(json);
    json = NULL;
    REQUIRE(queue_idle(&Q, 50), "a refused call queued a result");

    /* a closed client */
    config_json(cfg, sizeof cfg, NULL, NULL);
    EXPECT_OK(connect_on(&Q, cfg, NULL, NULL, &c));
    EXPECT_OK(close_on(&Q, c, NULL));
    EXPECT_FAIL(cn_send(c, ch, x.data, x.len, q, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_group_send(c, "g", x.data, x.len, q, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_receive(c, ch, q, NULL, &body, &len, &op), CN_CLOSED);
    EXPECT_FAIL(cn_new_channel(c, NULL, q, NULL, &name, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_group_add(c, "g", ch, q, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_group_discard(c, "g", ch), CN_CLOSED);
    EXPECT_FAIL(cn_flush(c), CN_CLOSED);
    EXPECT_FAIL(cn_stats(c, &json), CN_CLOSED);
    EXPECT_FAIL(cn_cancel(c, 1), CN_CLOSED);
    EXPECT_FAIL(cn_close(c, q, NULL), CN_CLOSED);
    c = 0;
    ok = 1;
out:
    cn_free(name);
    cn_free(json);
    free(big);
    if (c != 0) {
        close_on(&Q, c, NULL);
    }
    return ok;
}

/* ---- the log callback ---------------------------------------------------------------------- */

/* What the log callback saw; it runs on a library thread, hence the mutex. */
typedef struct {
    pthread_mutex_t mu;
    int calls;
    cn_client client;
    cn_queue queue;
    cn_status in_stats, in_take, in_send, in_queue_new;
    int error_set;
} logrec_t;

static void on_log_inner(void *closure, int level, const char *message) {
    logrec_t *r = closure;
    body_t x = body_of("sent-from-the-log-callback");
    char *json = NULL;
    cn_result res[1];
    size_t n = 0;
    cn_queue q = 0;
    cn_client c;
    cn_queue rq;
    cn_status a, b, s, qn;
    int e;
    (void)level;
    (void)message;
    pthread_mutex_lock(&r->mu);
    c = r->client;
    rq = r->queue;
    pthread_mutex_unlock(&r->mu);
    /* The library may hold its locks here: every call must be refused before it enters. */
    a = cn_stats(c, &json);
    e = cn_last_error()[0] != '\0';
    b = cn_queue_take(rq, res, 1, &n);
    s = cn_send(c, "work.fromlog", x.data, x.len, rq, NULL, NULL);
    qn = cn_queue_new(-1, &q);
    cn_free(json);
    pthread_mutex_lock(&r->mu);
    if (r->calls == 0) {
        r->in_stats = a;
        r->in_take = b;
        r->in_send = s;
        r->in_queue_new = qn;
        r->error_set = e;
    }
    r->calls++;
    pthread_mutex_unlock(&r->mu);
}

static int log_calls(logrec_t *r) {
    int n;
    pthread_mutex_lock(&r->mu);
    n = r->calls;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* A mailbox of capacity 1 drops the second message and logs it: inside the log callback every
   function returns CN_ILLEGAL_STATE. After the close's result no log record comes any more. */
static int check_log_callback_rules(char *why) {
    static logrec_t rec; /* outlives the client, whatever happens */
    char cfg[512], ch[128];
    body_t x = body_of("fills-the-mailbox");
    cn_client c = 0;
    long deadline;
    int ok = 0, i, at_close;
    memset(&rec, 0, sizeof rec);
    pthread_mutex_init(&rec.mu, NULL);
    rec.queue = Q.q;
    config_json(cfg, sizeof cfg, "\"capacity\": 1", NULL);
    EXPECT_OK(connect_on(&Q, cfg, on_log_inner, &rec, &c));
    pthread_mutex_lock(&rec.mu);
    rec.client = c;
    pthread_mutex_unlock(&rec.mu);
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    for (i = 0; i < 3; i++) {
        EXPECT_OK(send_msg(B, ch, &x));
    }
    deadline = hq_now_ms() + MS(5000);
    for (i = 0; i < 1000 && log_calls(&rec) == 0 && hq_now_ms() < deadline; i++) {
        sleep_ms(10);
    }
    REQUIRE(log_calls(&rec) > 0, "no log record for a full mailbox within 5 s");
    pthread_mutex_lock(&rec.mu);
    i = rec.in_stats == CN_ILLEGAL_STATE && rec.in_take == CN_ILLEGAL_STATE &&
        rec.in_send == CN_ILLEGAL_STATE && rec.in_queue_new == CN_ILLEGAL_STATE && rec.error_set;
    pthread_mutex_unlock(&rec.mu);
    REQUIRE(i, "inside the log callback: stats %d, take %d, send %d, queue_new %d (want %d), "
               "error text set %d",
            (int)rec.in_stats, (int)rec.in_take, (int)rec.in_send, (int)rec.in_queue_new,
            (int)CN_ILLEGAL_STATE, rec.error_set);
    EXPECT_OK(close_on(&Q, c, NULL));
    c = 0;
    at_close = log_calls(&rec);
    for (i = 0; i < 3; i++) {
        send_msg(B, ch, &x); /* nobody receives them */
    }
    sleep_ms(200);
    REQUIRE(log_calls(&rec) == at_close, "the log callback ran %d time(s) after the close",
            log_calls(&rec) - at_close);
    ok = 1;
out:
    if (c != 0) {
        close_on(&Q, c, NULL);
    }
    return ok;
}

/* cn_cancel of an op handle the library never issued: CN_INVALID_HANDLE ("0, or an op handle
   this library never issued"), not CN_NOT_PENDING ("the operation had already finished"). */
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
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    hq_got g;
    int ok = 0;
    hq_got_init(&g);
    EXPECT_OK(new_channel(A, ch, sizeof ch));
    snprintf(prefix, sizeof prefix, "%.22s", ch); /* "specific.<12 hex>!" */
    snprintf(orphan, sizeof orphan, "%sneverreceived%ld", prefix, (long)getpid());
    /* the prefix receive must be waiting before the send, or the message has no mailbox */
    EXPECT_ST(cn_receive(A, prefix, Q.q, NULL, &body, &len, &op), CN_PENDING);
    EXPECT_OK(send_msg(B, orphan, &x));
    REQUIRE(hq_await(&Q, op, MS(5000), &g) == 1, "the prefix receive got nothing for %s", orphan);
    op = 0;
    REQUIRE(g.status == CN_OK && got_is(&g, &x), "the prefix receive got status %d, len %zu",
            (int)g.status, g.len);
    ok = 1;
out:
    if (op != 0) {
        hq_cancel(&Q, A, op);
    }
    hq_got_clear(&g);
    return ok;
}

/* ---- connect and close --------------------------------------------------------------------- */

/* A connect still in progress: calls get CN_ILLEGAL_STATE; cn_close abandons it: the connect's
   result (CN_CLOSED) comes before the close's (CN_OK), both named by the client handle. */
static int check_close_abandons_connect(char *why) {
    static int connect_tag, close_tag;
    char cfg[256], *json = NULL;
    body_t x = body_of("too-early");
    cn_client c = 0;
    hq_got g1, g2;
    int ok = 0, port = 0, fd;
    long t0;
    hq_got_init(&g1);
    hq_got_init(&g2);
    fd = silent_listener(&port);
    REQUIRE(fd >= 0, "cannot open a listener: %s", strerror(errno));
    silent_config(cfg, sizeof cfg, port);
    EXPECT_ST(cn_connect(cfg, NULL, NULL, Q.q, &connect_tag, &c), CN_PENDING);
    REQUIRE(c != 0, "no handle with CN_PENDING");
    EXPECT_FAIL(cn_send(c, "work.early", x.data, x.len, Q.q, NULL, NULL), CN_ILLEGAL_STATE);
    EXPECT_FAIL(cn_stats(c, &json), CN_ILLEGAL_STATE);
    REQUIRE(queue_idle(&Q, 50), "the connect finished against a server that never answers");
    t0 = hq_now_ms();
    EXPECT_ST(cn_close(c, Q.q, &close_tag), CN_PENDING);
    EXPECT_FAIL(cn_close(c, Q.q, NULL), CN_CLOSED); /* already closing */
    REQUIRE(hq_await(&Q, 0, MS(5000), &g1) == 1 && hq_await(&Q, 0, MS(5000), &g2) == 1,
            "not two results within 5 s of the close");
    REQUIRE(hq_now_ms() - t0 < MS(5000), "abandoning the connect took %ld ms", hq_now_ms() - t0);
    REQUIRE(g1.op == c && g1.closure == (void *)&connect_tag && g1.status == CN_CLOSED,
            "first result: op %llu closure %p status %d, want the connect's, CN_CLOSED",
            (unsigned long long)g1.op, g1.closure, (int)g1.status);
    REQUIRE(g2.op == c && g2.closure == (void *)&close_tag && g2.status == CN_OK,
            "second result: op %llu closure %p status %d, want the close's, CN_OK",
            (unsigned long long)g2.op, g2.closure, (int)g2.status);
    EXPECT_FAIL(cn_flush(c), CN_CLOSED);
    c = 0;
    REQUIRE(queue_idle(&Q, 100), "a result came after the close's");
    ok = 1;
out:
    cn_free(json);
    if (c != 0) {
        close_on(&Q, c, NULL);
    }
    if (fd >= 0) {
        close(fd);
    }
    hq_got_clear(&g1);
    hq_got_clear(&g2);
    return ok;
}

/* Concurrent use from several threads: each has its own queue (one queue per thread that waits)
   and does send/receive round trips on its own channel. */
#define THREADS 4
#define ROUNDS 25

typedef struct {
    int index;
    char failure[200];
} worker_t;

static void *round_trip_worker(void *arg) {
    worker_t *w = arg;
    hq_t *h = malloc(sizeof *h); /* the stash is large for a thread stack under valgrind */
    char ch[128], text[64];
    int i;
    if (h == NULL || hq_open(h) != CN_OK) {
        snprintf(w->failure, sizeof w->failure, "no queue: %s", cn_last_error());
        free(h);
        return NULL;
    }
    if (new_channel_on(h, A, ch, sizeof ch) != CN_OK) {
        snprintf(w->failure, sizeof w->failure, "new_channel: %s", cn_last_error());
        i = ROUNDS;
    } else {
        i = 0;
    }
    for (; i < ROUNDS; i++) {
        body_t b;
        msg_t m = {NULL, 0};
        cn_status st;
        snprintf(text, sizeof text, "thread-%d-round-%d", w->index, i);
        b = body_of(text);
        st = send_on(h, B, ch, &b);
        if (st == CN_OK) {
            st = recv_on(h, A, ch, 5000, &m, NULL);
        }
        if (st != CN_OK || !msg_is(&m, &b)) {
            snprintf(w->failure, sizeof w->failure, "round %d: status %d, %s", i, (int)st,
                     st == CN_OK ? "wrong body" : cn_last_error());
            msg_free(&m);
            break;
        }
        msg_free(&m);
    }
    hq_close(h);
    free(h);
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

/* A close with receives waiting, each reporting to its own queue: their CN_CLOSED results are
   queued before the close's result (so they are there when it is taken), the close's text is the
   final statistics, and nothing comes after. */
static int check_pending_close(char *why) {
    char ch[128], plain[64];
    body_t x = body_of("after-close");
    hq_t q1, q2, qc;
    hq_got g, c1, c2;
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op1 = 0, op2 = 0;
    cn_client c = 0;
    int ok = 0;
    hq_init(&q1);
    hq_init(&q2);
    hq_init(&qc);
    hq_got_init(&g);
    hq_got_init(&c1);
    hq_got_init(&c2);
    EXPECT_OK(hq_open(&q1));
    EXPECT_OK(hq_open(&q2));
    EXPECT_OK(hq_open(&qc));
    EXPECT_OK(connect_client(&c));
    EXPECT_OK(new_channel(c, ch, sizeof ch));
    snprintf(plain, sizeof plain, "closing.q%ld", (long)getpid());
    EXPECT_ST(cn_receive(c, ch, q1.q, NULL, &body, &len, &op1), CN_PENDING);
    EXPECT_ST(cn_receive(c, plain, q2.q, NULL, &body, &len, &op2), CN_PENDING);
    EXPECT_ST(cn_close(c, qc.q, TAG), CN_PENDING);
    EXPECT_FAIL(cn_close(c, qc.q, NULL), CN_CLOSED); /* already closing */
    EXPECT_FAIL(cn_send(c, ch, x.data, x.len, qc.q, NULL, NULL), CN_CLOSED);
    REQUIRE(hq_await(&qc, c, MS(10000), &g) == 1, "no close result within 10 s");
    REQUIRE(g.status == CN_OK && g.closure == TAG, "close result: status %d closure %p",
            (int)g.status, g.closure);
    REQUIRE(g.has_text && g.text[0] == '{' && strstr(g.text, "\"published\"") != NULL,
            "the close's text is not the statistics: \"%.200s\"", g.text);
    /* taken without waiting: they were queued before the close's result */
    REQUIRE(hq_await(&q1, op1, 0, &c1) == 1, "the process receive's result was not queued first");
    REQUIRE(hq_await(&q2, op2, 0, &c2) == 1, "the plain receive's result was not queued first");
    REQUIRE(c1.status == CN_CLOSED && c1.has_text && c1.text[0] && c1.data == NULL,
            "process receive: status %d text \"%.200s\"; want CN_CLOSED with a detail", (int)c1.status,
            c1.text);
    REQUIRE(c2.status == CN_CLOSED, "plain receive: status %d, want CN_CLOSED", (int)c2.status);
    EXPECT_FAIL(cn_send(c, ch, x.data, x.len, Q.q, NULL, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_close(c, Q.q, NULL), CN_CLOSED);
    EXPECT_FAIL(cn_cancel(c, op1), CN_CLOSED);
    c = 0;
    EXPECT_OK(send_msg(B, ch, &x)); /* nobody may receive it */
    sleep_ms(300);
    REQUIRE(queue_idle(&q1, 0) && queue_idle(&q2, 0) && queue_idle(&qc, 0),
            "a result came after the close's");
    ok = 1;
out:
    if (c != 0) {
        close_on(&Q, c, NULL);
    }
    hq_close(&q1);
    hq_close(&q2);
    hq_close(&qc);
    hq_got_clear(&g);
    hq_got_clear(&c1);
    hq_got_clear(&c2);
    return ok;
}

static int check_close_clients(char *why) {
    hq_got ga, gb;
    int ok = 0;
    hq_got_init(&ga);
    hq_got_init(&gb);
    EXPECT_OK(close_on(&Q, A, &ga));
    EXPECT_OK(close_on(&Q, B, &gb));
    REQUIRE(ga.has_text && strstr(ga.text, "\"delivered\"") != NULL,
            "A's close has no statistics: \"%.200s\"", ga.text);
    EXPECT_FAIL(cn_flush(A), CN_CLOSED);
    A = B = 0;
    REQUIRE(queue_idle(&Q, 50), "results left in the main queue");
    ok = 1;
out:
    hq_got_clear(&ga);
    hq_got_clear(&gb);
    return ok;
}

/* ---- main ------------------------------------------------------------------------------- */

typedef int (*check_fn)(char *why);

static void run(const char *name, check_fn fn) {
    char why[WHYLEN];
    int ok;
    why[0] = '\0';
    ok = fn(why);
    report(name, ok, why);
    if (!ok) {
        queue_reset(&Q); /* what the failed check left in the main queue must not fail the next */
    }
}

static int leak_selftest(void) {
    cn_client c = 0;
    char first[128], *name = NULL;
    if (hq_open(&Q) != CN_OK || connect_client(&c) != CN_OK ||
        new_channel(c, first, sizeof first) != CN_OK || /* the process subscription */
        cn_new_channel(c, NULL, Q.q, NULL, &name, NULL) != CN_OK) {
        fprintf(stderr, "leak-selftest: %s\n", cn_last_error());
        return 1;
    }
    printf("leak-selftest: left %s (%zu bytes) unfreed on purpose\n", name, strlen(name) + 1);
    name = NULL; /* lose the pointer: valgrind must call it definitely lost */
    close_on(&Q, c, NULL);
    hq_close(&Q);
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
    alarm((unsigned)timeout); /* a hang ends the run (SIGALRM kills) instead of blocking CI */
    snprintf(g_prefix, sizeof g_prefix, "ctest%ld", (long)getpid());
    snprintf(group, sizeof group, "fan%ld", (long)getpid());
    if (argc > 2 && strcmp(argv[2], "--leak-selftest") == 0) {
        return leak_selftest();
    }

    run("version_and_status_text", check_version_status_text);
    run("queue_basics", check_queue_basics);
    if (hq_open(&Q) != CN_OK) {
        printf("FAIL main_queue: %s\n%d passed, %d failed\n", cn_last_error(), g_passed, g_failed + 1);
        return 1;
    }
    run("connect_queue", check_connect_queue);
    if (A == 0 || B == 0) { /* the other checks need the clients */
        printf("(the remaining checks need a connection and did not run)\n");
        printf("%d passed, %d failed\n", g_passed, g_failed);
        hq_close(&Q);
        return 1;
    }
    run("new_channel_first", check_new_channel_first);
    run("connect_no_server", check_connect_no_server);
    run("new_channel", check_new_channel);
    run("send_receive_immediate", check_send_receive_immediate);
    run("pending_receive", check_pending_receive);
    run("receive_again", check_receive_again);
    run("notify_bytes", check_notify_bytes);
    run("lent_bodies", check_lent_bodies);
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
    run("cancel_waiting_receive", check_cancel_waiting_receive);
    run("cancel_queued_result", check_cancel_queued_result);
    run("cancel_taken_result", check_cancel_taken_result);
    run("queue_free_pending_receive", check_queue_free_pending_receive);
    run("queue_free_untaken_result", check_queue_free_untaken_result);
    run("queue_free_abandons_connect", check_queue_free_abandons_connect);
    run("send_pending", check_send_pending);
    run("stats", check_stats);
    run("flush", check_flush);
    run("errors", check_errors);
    run("log_callback_rules", check_log_callback_rules);
    run("cancel_unknown_op", check_cancel_unknown_op);
    run("receive_process_prefix", check_receive_process_prefix);
    run("close_abandons_connect", check_close_abandons_connect);
    run("threads", check_threads);
    run("pending_close", check_pending_close);
    run("close_clients", check_close_clients);
    hq_close(&Q);

    printf("%d passed, %d failed\n", g_passed, g_failed);
    fflush(stdout);
    return g_failed == 0 ? 0 : 1;
}

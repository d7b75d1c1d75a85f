/*
 * queue_host.h - the host side of a channels-nats result queue, shared by abi_check.c and
 * fork_check.c: a pipe whose write end the library signals, poll() on its read end, and
 * cn_queue_take(), the way an event loop drives it (header "Result queues and threads").
 *
 * The one rule that makes it correct: read and discard the notify bytes BEFORE taking. A take
 * that finds the queue empty then guarantees that the next result writes a new byte, so waiting
 * in poll() after an empty take never misses a result. A take that filled the whole array may
 * have left results behind without a new byte, so the host takes again before it waits.
 *
 * Everything here is static inline: a program that uses only part of it gets no unused-function
 * warning (-Wall -Werror). Timeouts are milliseconds as given; the caller scales them.
 */
#ifndef CTEST_QUEUE_HOST_H
#define CTEST_QUEUE_HOST_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "channels_nats.h"

#define HQ_TEXT 1024 /* enough for a close's statistics */
#define HQ_STASH 16  /* results of other operations kept while waiting for one */
#define HQ_BATCH 8   /* results taken per cn_queue_take */
#define HQ_MAX_ROUNDS 100000 /* a bound on every wait loop besides its deadline */

/* No result came: not a cn_status the library returns. */
#define HQ_NO_RESULT ((cn_status)-1)

/* A result copied out of the queue, so that it outlives the next take. */
typedef struct {
    cn_op op;
    void *closure;
    cn_status status;
    int has_text;
    char text[HQ_TEXT];
    uint8_t *data; /* malloc'ed copy of the body, or NULL */
    size_t len;
} hq_got;

/* A result queue with its pipe, used by one thread at a time (the take rule of the header). */
typedef struct {
    cn_queue q;
    int rd, wr; /* the pipe: rd is polled, wr is the notify descriptor */
    int nstash;
    hq_got stash[HQ_STASH];
    cn_status take_status; /* the status of a cn_queue_take that failed, else CN_OK */
} hq_t;

static inline long hq_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static inline void hq_sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline int hq_set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

/* Reads and discards what waits on the non-blocking fd; returns how many bytes. */
static inline int hq_drain(int fd) {
    char buf[64];
    int total = 0, rounds;
    for (rounds = 0; rounds < HQ_MAX_ROUNDS; rounds++) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n > 0) {
            total += (int)n;
        } else if (!(n < 0 && errno == EINTR)) {
            break;
        }
    }
    return total;
}

/* poll() for POLLIN within timeout_ms (0: just look). */
static inline int hq_readable(int fd, long timeout_ms) {
    struct pollfd p;
    int n, rounds = 0;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    do {
        n = poll(&p, 1, (int)(timeout_ms < 0 ? 0 : timeout_ms));
    } while (n < 0 && errno == EINTR && ++rounds < 100);
    return n > 0 && (p.revents & POLLIN) != 0;
}

/* No queue, no pipe: what hq_close() may be called on before (or without) hq_open(). */
static inline void hq_init(hq_t *h) {
    memset(h, 0, sizeof *h);
    h->rd = h->wr = -1;
}

/* A queue signalled on a new non-blocking pipe. On failure nothing is left open. */
static inline cn_status hq_open(hq_t *h) {
    int fds[2];
    cn_status st;
    hq_init(h);
    if (pipe(fds) != 0) {
        return CN_ERR;
    }
    h->rd = fds[0];
    h->wr = fds[1];
    if (!hq_set_nonblock(h->rd) || !hq_set_nonblock(h->wr)) {
        st = CN_ERR;
    } else {
        st = cn_queue_new(h->wr, &h->q);
    }
    if (st != CN_OK) {
        close(h->rd);
        close(h->wr);
        h->rd = h->wr = -1;
        h->q = 0;
    }
    return st;
}

/* An empty result; every hq_got starts here (the functions below free what it holds). */
static inline void hq_got_init(hq_got *g) {
    memset(g, 0, sizeof *g);
    g->status = HQ_NO_RESULT;
}

static inline void hq_got_clear(hq_got *g) {
    free(g->data);
    memset(g, 0, sizeof *g);
    g->status = HQ_NO_RESULT;
}

/* Copies a lent result (valid until the next take) into g. */
static inline void hq_got_copy(hq_got *g, const cn_result *r) {
    free(g->data);
    g->op = r->op;
    g->closure = r->closure;
    g->status = r->status;
    g->has_text = r->text != NULL;
    g->text[0] = '\0';
    if (r->text != NULL) {
        size_t n = strlen(r->text);
        if (n >= HQ_TEXT) {
            n = HQ_TEXT - 1;
        }
        memcpy(g->text, r->text, n);
        g->text[n] = '\0';
    }
    g->data = NULL;
    g->len = r->len;
    if (r->data != NULL) {
        g->data = malloc(r->len ? r->len : 1);
        if (g->data == NULL) {
            abort();
        }
        memcpy(g->data, r->data, r->len);
    }
}

/* Frees the queue (pending operations that report to it are withdrawn), then the pipe: the
   library never closes notify, and the host may close it only after cn_queue_free. */
static inline void hq_close(hq_t *h) {
    int i;
    if (h->q != 0) {
        cn_queue_free(h->q);
        h->q = 0;
    }
    for (i = 0; i < h->nstash; i++) {
        free(h->stash[i].data);
    }
    h->nstash = 0;
    if (h->rd >= 0) {
        close(h->rd);
    }
    if (h->wr >= 0) {
        close(h->wr);
    }
    h->rd = h->wr = -1;
}

/* THE wait-and-take: waits up to timeout_ms for results and takes up to cap of them into res
   (lent until the next take). Returns how many (0: none came in time), or -1 when the take
   failed (its status in h->take_status). */
static inline long hq_take(hq_t *h, cn_result *res, size_t cap, long timeout_ms) {
    long deadline = hq_now_ms() + timeout_ms;
    int rounds;
    h->take_status = CN_OK;
    for (rounds = 0; rounds < HQ_MAX_ROUNDS; rounds++) {
        size_t n = 0;
        long left;
        hq_drain(h->rd); /* before the take, so no result is left unsignalled */
        h->take_status = cn_queue_take(h->q, res, cap, &n);
        if (h->take_status != CN_OK) {
            return -1;
        }
        if (n > 0) {
            return (long)n;
        }
        left = deadline - hq_now_ms();
        if (left <= 0) {
            return 0;
        }
        hq_readable(h->rd, left);
    }
    return 0;
}

/* Moves stash[i] into out. */
static inline void hq_unstash(hq_t *h, int i, hq_got *out) {
    free(out->data);
    *out = h->stash[i];
    memmove(&h->stash[i], &h->stash[i + 1], (size_t)(h->nstash - i - 1) * sizeof h->stash[0]);
    h->nstash--;
}

/* Waits up to timeout_ms for the result of op (op 0: any result), copied into out; results of
   other operations taken meanwhile are kept in the stash for their own wait. Returns 1, 0 when
   none came in time, -1 when a take failed or the stash overflowed. */
static inline int hq_await(hq_t *h, cn_op op, long timeout_ms, hq_got *out) {
    long deadline = hq_now_ms() + timeout_ms;
    cn_result res[HQ_BATCH];
    int i, found = 0, rounds;
    for (i = 0; i < h->nstash; i++) {
        if (op == 0 || h->stash[i].op == op) {
            hq_unstash(h, i, out);
            return 1;
        }
    }
    for (rounds = 0; rounds < HQ_MAX_ROUNDS && !found; rounds++) {
        long left = deadline - hq_now_ms(), n, k;
        n = hq_take(h, res, HQ_BATCH, left < 0 ? 0 : left);
        if (n < 0) {
            return -1;
        }
        if (n == 0) {
            return 0;
        }
        for (k = 0; k < n; k++) {
            if (!found && (op == 0 || res[k].op == op)) {
                hq_got_copy(out, &res[k]);
                found = 1;
            } else if (h->nstash == HQ_STASH) {
                return -1;
            } else {
                h->stash[h->nstash].data = NULL;
                hq_got_copy(&h->stash[h->nstash++], &res[k]);
            }
        }
    }
    return found;
}

/* cn_cancel(); when it gives back a result this host took already, the stashed copy goes too. */
static inline cn_status hq_cancel(hq_t *h, cn_client c, cn_op op) {
    cn_status st = cn_cancel(c, op);
    int i;
    if (st == CN_OK) {
        for (i = 0; i < h->nstash; i++) {
            if (h->stash[i].op == op) {
                free(h->stash[i].data);
                memmove(&h->stash[i], &h->stash[i + 1],
                        (size_t)(h->nstash - i - 1) * sizeof h->stash[0]);
                h->nstash--;
                break;
            }
        }
    }
    return st;
}

/* The outcome of a call that may go pending: its own status, or with CN_PENDING the status of
   its result within timeout_ms (HQ_NO_RESULT if none came). out (may be NULL) gets the result. */
static inline cn_status hq_settle(hq_t *h, cn_status st, cn_op op, long timeout_ms, hq_got *out) {
    hq_got local;
    cn_status result;
    if (st != CN_PENDING) {
        return st;
    }
    hq_got_init(&local);
    if (hq_await(h, op, timeout_ms, &local) != 1) {
        free(local.data);
        return HQ_NO_RESULT;
    }
    result = local.status;
    if (out != NULL) {
        free(out->data);
        *out = local;
    } else {
        free(local.data);
    }
    return result;
}

#endif /* CTEST_QUEUE_HOST_H */

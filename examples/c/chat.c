/*
 * chat.c - one round trip through channels-nats from C.
 *
 * Connects, makes a process channel, adds it to the group "chat", sends one message to the
 * group and receives it back on the channel. No call of the library waits: an operation either
 * finishes during its call (CN_OK) or returns CN_PENDING and later puts its result into a result
 * queue. This program has one queue, signalled on a pipe, and waits for it with poll(), the way
 * an event loop would. Every result comes back with the closure given to its operation, here a
 * struct outcome that the result is copied into.
 *
 * Usage: chat [nats-url]      (default nats://127.0.0.1:4222)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _WIN32
/* Windows has no pipe an event loop can watch: the library signals a SOCKET there (see
   wheels/queue_check.c). To need no Winsock, this example polls its queue on Windows instead. */
#include <windows.h>
#else
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#endif

#include "channels_nats.h"

/* Reports a failed call: the status name and this thread's detail of the last failed call. */
static int failed(cn_status st, const char *what) {
    if (st == CN_OK) return 0;
    fprintf(stderr, "chat: %s: %s (%s)\n", what, cn_status_text(st), cn_last_error());
    return 1;
}

/* The log callback: runs on a library thread and must not call the library. */
static void on_log(void *closure, int level, const char *message) {
    (void)closure;
    fprintf(stderr, "chat: log %d: %s\n", level, message);
}

/* ---- msgpack, just enough for this demo: a map of up to 15 str -> str pairs ------------- */
/* The body of every Channels message is a msgpack map with string keys (see the README's wire
   contract). Strings here are fixstr (< 32 bytes) or str8 (< 256 bytes). */

static int mp_put_str(uint8_t *buf, size_t cap, size_t *pos, const char *s) {
    size_t n = strlen(s), head = n < 32 ? 1 : 2;
    if (n > 255 || *pos + head + n > cap) return 0;
    if (n < 32) buf[(*pos)++] = (uint8_t)(0xa0 | n);           /* fixstr: 101xxxxx */
    else { buf[(*pos)++] = 0xd9; buf[(*pos)++] = (uint8_t)n; } /* str8: 0xd9, length */
    memcpy(buf + *pos, s, n);
    *pos += n;
    return 1;
}

/* Encodes {keys[i]: values[i]} into buf. Returns the length, or 0 when it does not fit. */
static size_t mp_encode_map(uint8_t *buf, size_t cap, const char *const *keys,
                            const char *const *values, size_t pairs) {
    size_t pos = 0, i;
    if (pairs > 15 || cap < 1) return 0;
    buf[pos++] = (uint8_t)(0x80 | pairs); /* fixmap: 1000xxxx */
    for (i = 0; i < pairs; i++)
        if (!mp_put_str(buf, cap, &pos, keys[i]) || !mp_put_str(buf, cap, &pos, values[i])) return 0;
    return pos;
}

/* Reads a str at *pos into *s, *n (not NUL-terminated). Returns 0 if there is none. */
static int mp_get_str(const uint8_t *buf, size_t len, size_t *pos, const char **s, size_t *n) {
    if (*pos >= len) return 0;
    if ((buf[*pos] & 0xe0) == 0xa0) *n = buf[(*pos)++] & 0x1f;
    else if (buf[*pos] == 0xd9 && *pos + 1 < len) { *n = buf[*pos + 1]; *pos += 2; }
    else return 0;
    if (*n > len - *pos) return 0;
    *s = (const char *)buf + *pos;
    *pos += *n;
    return 1;
}

/* Finds the value of key in a fixmap of str -> str. Returns 0 if it is not there. */
static int mp_find_str(const uint8_t *buf, size_t len, const char *key, const char **s, size_t *n) {
    size_t pos = 1, i, kn;
    const char *k;
    if (len < 1 || (buf[0] & 0xf0) != 0x80) return 0;
    for (i = 0; i < (size_t)(buf[0] & 0x0f); i++) {
        if (!mp_get_str(buf, len, &pos, &k, &kn) || !mp_get_str(buf, len, &pos, s, n)) return 0;
        if (kn == strlen(key) && memcmp(k, key, kn) == 0) return 1;
    }
    return 0;
}

/* ---- The result queue and its notify pipe ------------------------------------------------ */

/* What became of one pending operation: its cn_result, copied, because what a result points
   to is only lent until the next cn_queue_take() of the queue. */
struct outcome {
    int done;
    cn_status status;
    char *text;    /* malloc'ed copy, or NULL */
    uint8_t *data; /* malloc'ed copy of a received body, or NULL */
    size_t len;
};

static void *copy_of(const void *p, size_t n) {
    void *copy = p != NULL ? malloc(n ? n : 1) : NULL;
    if (copy != NULL) memcpy(copy, p, n);
    return copy;
}

static void outcome_free(struct outcome *o) {
    free(o->text);
    free(o->data);
    memset(o, 0, sizeof *o);
}

struct loop {
    cn_queue queue;
    int notify[2]; /* the pipe: the library writes notify[1], we poll notify[0]; -1 on Windows */
};

static long now_ms(void) {
#ifdef _WIN32
    return (long)GetTickCount();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
#endif
}

/* Makes the queue. POSIX: a non-blocking pipe whose write end the library signals with one byte
   whenever the queue goes from empty to non-empty. */
static cn_status loop_open(struct loop *l) {
    intptr_t notify = -1;
    cn_status st;
    l->queue = 0;
    l->notify[0] = l->notify[1] = -1;
#ifndef _WIN32
    if (pipe(l->notify) != 0) {
        fprintf(stderr, "chat: pipe failed\n");
        return CN_ERR;
    }
    fcntl(l->notify[0], F_SETFL, fcntl(l->notify[0], F_GETFL) | O_NONBLOCK);
    fcntl(l->notify[1], F_SETFL, fcntl(l->notify[1], F_GETFL) | O_NONBLOCK);
    notify = l->notify[1];
#endif
    st = cn_queue_new(notify, &l->queue);
    return st;
}

/* Frees the queue, then the pipe (the library never closes it; it must stay open until here). */
static void loop_close(struct loop *l) {
    if (l->queue != 0) cn_queue_free(l->queue);
#ifndef _WIN32
    if (l->notify[0] >= 0) close(l->notify[0]);
    if (l->notify[1] >= 0) close(l->notify[1]);
#endif
}

/* One turn of the event loop: reads and discards the notify bytes FIRST, then takes every
   result and copies each into the outcome its closure points to. Reading first means a take that
   finds the queue empty leaves nothing unsignalled: the next result writes a new byte. */
static cn_status loop_take(struct loop *l) {
    cn_result results[8];
    size_t count, i;
    cn_status st;
#ifndef _WIN32
    char bytes[64];
    while (read(l->notify[0], bytes, sizeof bytes) > 0) {}
#endif
    do {
        if ((st = cn_queue_take(l->queue, results, 8, &count)) != CN_OK) return st;
        for (i = 0; i < count; i++) {
            struct outcome *o = results[i].closure;
            if (o == NULL) continue; /* not an operation this program waits for */
            o->status = results[i].status;
            o->text = results[i].text ? copy_of(results[i].text, strlen(results[i].text) + 1)
                                      : NULL;
            o->data = copy_of(results[i].data, results[i].len);
            o->len = results[i].len;
            o->done = 1;
        }
    } while (count == 8); /* a full array may have left results behind, without a new byte */
    return CN_OK;
}

/* Runs the loop until o is done or timeout_ms passed: take, then sleep in poll() on the pipe. */
static int wait_for(struct loop *l, struct outcome *o, long timeout_ms) {
    long deadline = now_ms() + timeout_ms, left;
    while (!o->done) {
        if (failed(loop_take(l), "queue_take")) return 0;
        if (o->done || (left = deadline - now_ms()) <= 0) break;
#ifdef _WIN32
        Sleep(left < 10 ? (DWORD)left : 10);
#else
        {
            struct pollfd p = {0, POLLIN, 0};
            p.fd = l->notify[0];
            poll(&p, 1, (int)left);
        }
#endif
    }
    return o->done;
}

/* The status of an operation that returned st: its own, or with CN_PENDING its result's. */
static cn_status settle(struct loop *l, cn_status st, struct outcome *o) {
    if (st != CN_PENDING) return st;
    if (!wait_for(l, o, 10000)) {
        fprintf(stderr, "chat: no result within 10 s\n");
        return CN_TIMEOUT;
    }
    if (o->status != CN_OK) fprintf(stderr, "chat: %s\n", o->text ? o->text : "");
    return o->status;
}

int main(int argc, char **argv) {
    const char *url = argc > 1 ? argv[1] : "nats://127.0.0.1:4222";
    const char *keys[] = {"type", "text"}, *values[] = {"chat.message", "hello from C"};
    struct loop loop;
    struct outcome connected = {0}, named = {0}, added = {0}, sent = {0}, received = {0},
                   closed = {0};
    char config[512], channel[256], *name = NULL;
    uint8_t msg[256];
    const uint8_t *body = NULL;
    size_t msg_len, body_len = 0, text_len;
    const char *text;
    cn_client client = 0;
    cn_op op = 0;
    cn_status st;
    int rc = 1;

    /* The configuration is the JSON form of the Django CONFIG block (the URL goes in as is). */
    if (strpbrk(url, "\"\\") ||
        snprintf(config, sizeof config, "{\"servers\": [\"%s\"]}", url) >= (int)sizeof config) {
        fprintf(stderr, "chat: unusable URL\n");
        return 2;
    }
    printf("channels-nats %s, server %s\n", cn_version(), url);
    if (failed(loop_open(&loop), "queue_new")) {
        loop_close(&loop);
        return 1;
    }

    /* Connecting is always pending: the handle is ours at once, usable once the result is CN_OK. */
    st = cn_connect(config, on_log, NULL, loop.queue, &connected, &client);
    if (failed(settle(&loop, st, &connected), "connect")) {
        loop_close(&loop);
        outcome_free(&connected);
        return 1;
    }

    /* A process channel: at once (the name is ours to cn_free()) or pending (the name is the
       result's text), when the client's subscription is not confirmed by the server yet. */
    st = cn_new_channel(client, NULL, loop.queue, &named, &name, &op);
    if (failed(settle(&loop, st, &named), "new_channel")) goto out;
    snprintf(channel, sizeof channel, "%s", name ? name : named.text);
    cn_free(name);
    printf("channel: %s\n", channel);
    st = cn_group_add(client, "chat", channel, loop.queue, &added, &op);
    if (failed(settle(&loop, st, &added), "group_add")) goto out;

    /* Start the receive first, so that it waits (CN_PENDING) and its result brings the message.
       Had a message been waiting, CN_OK would lend it at once in body / body_len instead. */
    st = cn_receive(client, channel, loop.queue, &received, &body, &body_len, &op);
    if (st == CN_OK) {
        received.data = copy_of(body, body_len);
        received.len = body_len;
        received.done = 1;
    } else if (st != CN_PENDING) {
        failed(st, "receive");
        goto out;
    }
    printf("receive: %s\n", st == CN_PENDING ? "CN_PENDING, the queue will bring it" : "CN_OK");

    /* A send is accepted at once unless the outbound buffer is full; then it is pending. */
    msg_len = mp_encode_map(msg, sizeof msg, keys, values, 2);
    st = cn_group_send(client, "chat", msg, msg_len, loop.queue, &sent, NULL);
    if (failed(settle(&loop, st, &sent), "group_send")) goto out;

    /* Wait up to 5 seconds. On timeout, cancel: CN_OK means the receive is withdrawn (a message it
       had got goes back to the mailbox); CN_NOT_PENDING means its result is in, so take it. */
    if (!wait_for(&loop, &received, 5000) && cn_cancel(client, op) == CN_NOT_PENDING)
        wait_for(&loop, &received, 1000);
    if (!received.done || received.status != CN_OK || received.data == NULL)
        fprintf(stderr, "chat: no message: %s\n",
                received.done ? cn_status_text(received.status) : "none within 5 s");
    else if (!mp_find_str(received.data, received.len, "text", &text, &text_len))
        fprintf(stderr, "chat: the message has no str field \"text\"\n");
    else {
        printf("received: %.*s\n", (int)text_len, text);
        rc = 0;
    }

out:
    /* Closing is always pending too: operations still pending end with CN_CLOSED, and after the
       close's result (its text: the client's final statistics) nothing of the client comes. */
    st = cn_close(client, loop.queue, &closed);
    if (failed(settle(&loop, st, &closed), "close")) rc = 1;
    loop_close(&loop);
    outcome_free(&connected);
    outcome_free(&named);
    outcome_free(&added);
    outcome_free(&sent);
    outcome_free(&received);
    outcome_free(&closed);
    return rc;
}

/*
 * chat.c - one round trip through channels-nats from C.
 *
 * Connects, makes a process channel, adds it to the group "chat", sends one message to the
 * group and receives it back on the channel. The receive uses the pending form: a callback on a
 * library thread hands the message to the main thread through a mutex and a condition variable.
 *
 * Usage: chat [nats-url]      (default nats://127.0.0.1:4222)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "channels_nats.h"

/* Reports a failed call: the status name and this thread's detail of the last failed call. */
static int failed(cn_status st, const char *what) {
    if (st == CN_OK) return 0;
    fprintf(stderr, "chat: %s: %s (%s)\n", what, cn_status_text(st), cn_last_error());
    return 1;
}

/* The log callback: runs on any library thread and must not call the library. */
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

/* ---- The pending receive: the callback hands its result to the waiting thread ---------- */

struct inbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;          /* the callback ran */
    cn_status status;  /* its status */
    uint8_t *body;     /* our copy of the message: the callback's data dies when it returns */
    size_t len;
};

/* Called once, on a library thread. Must return quickly: it holds up this client's delivery. */
static void on_receive(void *closure, cn_status status, const char *text, const uint8_t *data,
                       size_t len) {
    struct inbox *in = closure;
    pthread_mutex_lock(&in->mu);
    in->status = status;
    if (status != CN_OK)
        fprintf(stderr, "chat: receive: %s (%s)\n", cn_status_text(status), text ? text : "");
    else if ((in->body = malloc(len)) != NULL) {
        memcpy(in->body, data, len);
        in->len = len;
    }
    in->done = 1;
    pthread_cond_signal(&in->cv);
    pthread_mutex_unlock(&in->mu);
}

int main(int argc, char **argv) {
    const char *url = argc > 1 ? argv[1] : "nats://127.0.0.1:4222";
    const char *keys[] = {"type", "text"}, *values[] = {"chat.message", "hello from C"};
    struct inbox in = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, CN_OK, NULL, 0};
    char config[512], *channel = NULL;
    uint8_t msg[256], *body = NULL;
    size_t msg_len, body_len = 0, text_len;
    const char *text;
    struct timespec deadline;
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

    /* Waiting form (callback NULL): returns once connected, or with the reason it could not. */
    if (failed(cn_connect(config, on_log, NULL, NULL, NULL, &client), "connect")) return 1;

    /* A process channel of this client; the name is ours to cn_free(). */
    if (failed(cn_new_channel(client, NULL, NULL, NULL, &channel, NULL), "new_channel")) goto out;
    printf("channel: %s\n", channel);
    if (failed(cn_group_add(client, "chat", channel, NULL, NULL, NULL), "group_add")) goto out;

    /* Start the receive first, so that it waits (CN_PENDING) and the callback gets the message.
       Had a message been waiting, CN_OK would return it at once in body / body_len instead. */
    st = cn_receive(client, channel, on_receive, &in, &body, &body_len, &op);
    if (st == CN_OK) { on_receive(&in, CN_OK, NULL, body, body_len); cn_free(body); }
    else if (st != CN_PENDING) { failed(st, "receive"); goto out; }
    printf("receive: %s\n", st == CN_PENDING ? "CN_PENDING, the callback will get it" : "CN_OK");

    msg_len = mp_encode_map(msg, sizeof msg, keys, values, 2);
    if (failed(cn_group_send(client, "chat", msg, msg_len, NULL, NULL, NULL), "group_send"))
        goto out; /* cn_close() below ends the pending receive with CN_CLOSED */

    /* Wait up to 5 seconds for the callback. On timeout, cancel: CN_OK means the callback will
       not run; CN_NOT_PENDING means it runs or ran, so wait for it after all. */
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 5;
    pthread_mutex_lock(&in.mu);
    while (!in.done && pthread_cond_timedwait(&in.cv, &in.mu, &deadline) == 0) {}
    if (!in.done) {
        pthread_mutex_unlock(&in.mu); /* the callback needs the mutex to finish */
        st = cn_cancel(client, op);
        pthread_mutex_lock(&in.mu);
        if (st != CN_NOT_PENDING) { in.done = 1; in.status = CN_TIMEOUT; }
        while (!in.done) pthread_cond_wait(&in.cv, &in.mu);
    }
    st = in.status;
    pthread_mutex_unlock(&in.mu);

    if (st != CN_OK || in.body == NULL)
        fprintf(stderr, "chat: no message: %s\n", cn_status_text(st));
    else if (!mp_find_str(in.body, in.len, "text", &text, &text_len))
        fprintf(stderr, "chat: the message has no str field \"text\"\n");
    else {
        printf("received: %.*s\n", (int)text_len, text);
        rc = 0;
    }

out:
    /* Waiting form: once it returns, no callback of this client runs any more, so in.body and
       in are ours alone again. */
    if (failed(cn_close(client, NULL, NULL), "close")) rc = 1;
    free(in.body);
    cn_free(channel);
    return rc;
}

/*
 * queue_check.c - the result queue of a platform's library, driven the way an event loop does:
 * a socket pair whose write end the library signals (a SOCKET on Windows, where the library
 * sends with WSASend; a descriptor elsewhere), select() on the read end, then cn_queue_take().
 * Every host, the Python package first, depends on exactly this path, so wheels-check runs it on
 * every library it can execute here (natively, under qemu-user, under Wine).
 *
 * It connects through the queue (connect is always pending), receives one message through it
 * (a pending receive, the signal, the take: the message and its closure), gives a taken result
 * back with cn_cancel() (the message returns to its mailbox and a receive lends it at once), takes
 * the three results one group message makes in one call (signalled once), and closes through the
 * queue (the final statistics as the close's result).
 *
 * Usage: queue_check nats-url      Prints "queue: ok" and exits 0, or says what failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <winsock2.h>
typedef SOCKET sock_t;
#define close_sock closesocket
#else
#include <fcntl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>
typedef int sock_t;
#define close_sock close
#endif

#include "channels_nats.h"

/* {"type": "q"} as msgpack. */
static const uint8_t BODY[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'q'};

#define BACKLOG 3

static int fail(const char *what, cn_status st) {
    fprintf(stderr, "queue_check: %s: %s (%s)\n", what, cn_status_text(st), cn_last_error());
    return 1;
}

static int fail_text(const char *what) {
    fprintf(stderr, "queue_check: %s\n", what);
    return 1;
}

/* A connected pair of stream sockets: s[0] is read, s[1] is written by the library (made
   non-blocking, so a full socket never holds up the library's thread). */
static int socket_pair(sock_t s[2]) {
#ifdef _WIN32
    /* Winsock has no socketpair(): a loopback listener, a connect, an accept. */
    WSADATA wsa;
    struct sockaddr_in addr;
    int len = sizeof addr;
    u_long nonblocking = 1;
    sock_t listener;
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) return 0;
    listener = socket(AF_INET, SOCK_STREAM, 0);
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (listener == INVALID_SOCKET || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(listener, 1) != 0 || getsockname(listener, (struct sockaddr *)&addr, &len) != 0)
        return 0;
    s[1] = socket(AF_INET, SOCK_STREAM, 0);
    if (s[1] == INVALID_SOCKET || connect(s[1], (struct sockaddr *)&addr, sizeof addr) != 0) return 0;
    s[0] = accept(listener, NULL, NULL);
    closesocket(listener);
    return s[0] != INVALID_SOCKET && ioctlsocket(s[1], FIONBIO, &nonblocking) == 0;
#else
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
    s[0] = fds[0];
    s[1] = fds[1];
    return fcntl(s[1], F_SETFL, fcntl(s[1], F_GETFL) | O_NONBLOCK) == 0;
#endif
}

/* Waits up to 10 s for the library's signal, then reads the byte(s): the host reads them BEFORE
   it takes, so that a take finding the queue empty means the next result signals again. */
static int wait_signal(sock_t reader) {
    fd_set readable;
    struct timeval timeout = {10, 0};
    char bytes[16];
    FD_ZERO(&readable);
    FD_SET(reader, &readable);
    if (select((int)reader + 1, &readable, NULL, NULL, &timeout) != 1) return 0;
    return recv(reader, bytes, sizeof bytes, 0) > 0;
}

/* Waits for the signal and takes up to want results in ONE take (what a take lends stays valid
   only until the next one). Returns how many, 0 when nothing came within 10 s. */
static size_t take(sock_t reader, cn_queue queue, cn_result *results, size_t want) {
    size_t count = 0;
    int tries;
    /* a signal with nothing to take: a byte from a result already taken; wait for the next */
    for (tries = 0; tries < 20 && count == 0; tries++) {
        if (!wait_signal(reader)) return 0;
        if (cn_queue_take(queue, results, want, &count) != CN_OK) return 0;
    }
    return count;
}

/* The status of a call that may go pending: its own, or with CN_PENDING its result's (copied to
   *result, lent until the next take). */
static cn_status finish(sock_t reader, cn_queue queue, cn_status st, cn_op op, cn_result *result) {
    if (st != CN_PENDING) return st;
    if (take(reader, queue, result, 1) != 1 || result->op != op) return CN_TIMEOUT;
    return result->status;
}

/* A new process channel of client, its name copied into channel. */
static cn_status new_channel(sock_t reader, cn_queue queue, cn_client client, char *channel,
                             size_t n) {
    cn_result result;
    char *name = NULL;
    cn_op op = 0;
    cn_status st = cn_new_channel(client, NULL, queue, NULL, &name, &op);
    if (st == CN_OK) {
        snprintf(channel, n, "%s", name); /* ours: freed with cn_free */
        cn_free(name);
    } else if ((st = finish(reader, queue, st, op, &result)) == CN_OK) {
        snprintf(channel, n, "%s", result.text); /* lent: copied */
    }
    return st;
}

int main(int argc, char **argv) {
    char config[512], channel[128], members[BACKLOG][128], group[] = "queue_check";
    cn_client client = 0;
    cn_queue queue = 0;
    cn_result results[BACKLOG + 1];
    const uint8_t *body = NULL;
    size_t len = 0, count, i, j;
    cn_op op = 0, backlog[BACKLOG];
    sock_t pair[2];
    cn_status st;

    if (argc != 2) {
        fprintf(stderr, "usage: queue_check nats-url\n");
        return 2;
    }
    snprintf(config, sizeof config, "{\"servers\": [\"%s\"]}", argv[1]);
    if (!socket_pair(pair)) return fail_text("cannot make a socket pair");
    if ((st = cn_queue_new((intptr_t)pair[1], &queue)) != CN_OK) return fail("cn_queue_new", st);

    /* The connect, always pending: its result names the client. */
    if ((st = cn_connect(config, NULL, NULL, queue, (void *)(uintptr_t)7, &client)) != CN_PENDING)
        return fail("cn_connect (want CN_PENDING)", st);
    if (take(pair[0], queue, results, 1) != 1 || results[0].op != client ||
        (uintptr_t)results[0].closure != 7)
        return fail_text("no result of the connect within 10 s");
    if (results[0].status != CN_OK) return fail("connect", results[0].status);
    if ((st = new_channel(pair[0], queue, client, channel, sizeof channel)) != CN_OK)
        return fail("cn_new_channel", st);

    /* A receive that waits, finished through the queue. */
    st = cn_receive(client, channel, queue, (void *)(uintptr_t)42, &body, &len, &op);
    if (st != CN_PENDING) return fail("cn_receive (want CN_PENDING)", st);
    if ((st = cn_send(client, channel, BODY, sizeof BODY, queue, NULL, NULL)) != CN_OK)
        return fail("cn_send", st);
    count = take(pair[0], queue, results, BACKLOG + 1);
    if (count != 1 || results[0].op != op || results[0].status != CN_OK ||
        (uintptr_t)results[0].closure != 42 || results[0].len != sizeof BODY ||
        memcmp(results[0].data, BODY, sizeof BODY) != 0) {
        fprintf(stderr, "queue_check: took %u result(s), not the message\n", (unsigned)count);
        return 1;
    }

    /* Given back after the take (a consumer that went away): the message returns to the front of
       its mailbox, and the next receive lends it at once. */
    if ((st = cn_cancel(client, op)) != CN_OK) return fail("cn_cancel of a taken result", st);
    if ((st = cn_receive(client, channel, queue, NULL, &body, &len, &op)) != CN_OK)
        return fail("cn_receive of the given-back message (want CN_OK)", st);
    if (len != sizeof BODY || memcmp(body, BODY, sizeof BODY) != 0)
        return fail_text("the given-back message differs");

    /* A backlog taken in one call: one group message finishes three waiting receives, and the
       library signals once, after the last of the three results is queued. */
    for (i = 0; i < BACKLOG; i++) {
        if ((st = new_channel(pair[0], queue, client, members[i], sizeof members[i])) != CN_OK)
            return fail("cn_new_channel", st);
        st = cn_group_add(client, group, members[i], queue, NULL, &op);
        if ((st = finish(pair[0], queue, st, op, results)) != CN_OK) return fail("cn_group_add", st);
    }
    for (i = 0; i < BACKLOG; i++) {
        st = cn_receive(client, members[i], queue, NULL, &body, &len, &backlog[i]);
        if (st != CN_PENDING) return fail("cn_receive of a member (want CN_PENDING)", st);
    }
    if ((st = cn_group_send(client, group, BODY, sizeof BODY, queue, NULL, NULL)) != CN_OK)
        return fail("cn_group_send", st);
    count = take(pair[0], queue, results, BACKLOG + 1);
    if (count != BACKLOG) {
        fprintf(stderr, "queue_check: the group message gave %u result(s) in one take, want %d\n",
                (unsigned)count, BACKLOG);
        return 1;
    }
    for (i = 0; i < BACKLOG; i++) {
        for (j = 0; j < BACKLOG && results[j].op != backlog[i]; j++) {}
        if (j == BACKLOG || results[j].status != CN_OK || results[j].len != sizeof BODY ||
            memcmp(results[j].data, BODY, sizeof BODY) != 0)
            return fail_text("the backlog's results are not the group message for each member");
    }

    /* The close, always pending: its result names the client and carries the statistics. */
    if ((st = cn_close(client, queue, NULL)) != CN_PENDING) return fail("cn_close (want CN_PENDING)", st);
    if (take(pair[0], queue, results, 1) != 1 || results[0].op != client ||
        results[0].status != CN_OK || results[0].text == NULL || results[0].text[0] != '{')
        return fail_text("no result of the close with the statistics within 10 s");
    if ((st = cn_queue_free(queue)) != CN_OK) return fail("cn_queue_free", st);
    close_sock(pair[0]);
    close_sock(pair[1]);
    printf("queue: ok\n");
    return 0;
}

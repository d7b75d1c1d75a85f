/*
 * queue_check.c - the result queue of a platform's library, driven the way an event loop does:
 * a socket pair whose write end the library signals (a SOCKET on Windows, where the library
 * sends with WSASend; a descriptor elsewhere), select() on the read end, then cn_queue_take().
 * The Python package depends on exactly this path, so wheels-check runs it on every library it
 * can execute here (natively, under qemu-user, under Wine).
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
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>
typedef int sock_t;
#define close_sock close
#endif

#include "channels_nats.h"

/* {"type": "q"} as msgpack. */
static const uint8_t BODY[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'q'};

static int fail(const char *what, cn_status st) {
    fprintf(stderr, "queue_check: %s: %s (%s)\n", what, cn_status_text(st), cn_last_error());
    return 1;
}

/* A connected pair of stream sockets: s[0] is read, s[1] is written by the library. */
static int socket_pair(sock_t s[2]) {
#ifdef _WIN32
    /* Winsock has no socketpair(): a loopback listener, a connect, an accept. */
    WSADATA wsa;
    struct sockaddr_in addr;
    int len = sizeof addr;
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
    return s[0] != INVALID_SOCKET;
#else
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
    s[0] = fds[0];
    s[1] = fds[1];
    return 1;
#endif
}

/* Waits up to 10 s for the library's signal, then reads the byte(s). */
static int wait_signal(sock_t reader) {
    fd_set readable;
    struct timeval timeout = {10, 0};
    char bytes[16];
    FD_ZERO(&readable);
    FD_SET(reader, &readable);
    if (select((int)reader + 1, &readable, NULL, NULL, &timeout) != 1) return 0;
    return recv(reader, bytes, sizeof bytes, 0) > 0;
}

/* Never called: with a result queue, results are taken, not called back. */
static void unexpected(void *closure, cn_status st, const char *text, const uint8_t *data, size_t len) {
    (void)closure, (void)st, (void)text, (void)data, (void)len;
    fprintf(stderr, "queue_check: a callback ran although the client has a result queue\n");
    exit(1);
}

int main(int argc, char **argv) {
    char config[512], *channel = NULL;
    cn_client client;
    cn_queue queue;
    cn_result results[4];
    size_t count = 0, len = 0;
    void *memory = NULL;
    uint8_t *body = NULL, *block = NULL;
    sock_t pair[2];
    cn_status st;

    if (argc != 2) {
        fprintf(stderr, "usage: queue_check nats-url\n");
        return 2;
    }
    snprintf(config, sizeof config, "{\"servers\": [\"%s\"]}", argv[1]);
    if (!socket_pair(pair)) {
        fprintf(stderr, "queue_check: cannot make a socket pair\n");
        return 1;
    }
    if ((st = cn_queue_new((intptr_t)pair[1], &queue)) != CN_OK) return fail("cn_queue_new", st);
    if ((st = cn_connect(config, NULL, NULL, NULL, NULL, &client)) != CN_OK) return fail("cn_connect", st);
    if ((st = cn_set_result_queue(client, queue)) != CN_OK) return fail("cn_set_result_queue", st);
    if ((st = cn_new_channel(client, NULL, NULL, NULL, &channel, NULL)) != CN_OK) return fail("cn_new_channel", st);

    /* A receive that waits, finished through the queue. */
    st = cn_receive(client, channel, unexpected, (void *)(uintptr_t)42, &body, &len, NULL);
    if (st != CN_PENDING) return fail("cn_receive (want CN_PENDING)", st);
    if ((st = cn_send(client, channel, BODY, sizeof BODY, unexpected, NULL, NULL)) != CN_OK) return fail("cn_send", st);
    if (!wait_signal(pair[0])) {
        fprintf(stderr, "queue_check: no signal on the socket within 10 s\n");
        return 1;
    }
    if ((st = cn_queue_take(queue, results, 4, &count, &memory)) != CN_OK) return fail("cn_queue_take", st);
    if (count != 1 || results[0].status != CN_OK || (uintptr_t)results[0].closure != 42 ||
        results[0].len != sizeof BODY || memcmp(results[0].data, BODY, sizeof BODY) != 0) {
        fprintf(stderr, "queue_check: took %u result(s), not the message\n", (unsigned)count);
        return 1;
    }
    cn_free(memory);

    /* A backlog taken in one call. */
    for (int i = 0; i < 3; i++)
        if ((st = cn_send(client, channel, BODY, sizeof BODY, unexpected, NULL, NULL)) != CN_OK) return fail("cn_send", st);
    for (int tries = 0; count != 3 && tries < 100; tries++) {
        if (block != NULL) {
            cn_put_back_many(client, channel, block, len);
            cn_free(block);
            block = NULL;
        }
        if ((st = cn_receive_many(client, channel, 10, &block, &len, &count)) != CN_OK) return fail("cn_receive_many", st);
#ifdef _WIN32
        Sleep(50);
#else
        usleep(50000);
#endif
    }
    if (count != 3 || len != 3 * (8 + sizeof BODY)) {
        fprintf(stderr, "queue_check: cn_receive_many took %u message(s) in %u bytes, want 3\n", (unsigned)count,
                (unsigned)len);
        return 1;
    }
    cn_free(block);
    cn_free(channel);
    if ((st = cn_close(client, NULL, NULL)) != CN_OK) return fail("cn_close", st);
    if ((st = cn_queue_free(queue)) != CN_OK) return fail("cn_queue_free", st);
    close_sock(pair[0]);
    close_sock(pair[1]);
    printf("queue: ok\n");
    return 0;
}

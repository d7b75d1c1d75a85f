/*
 * fork_check: the fork guard of the channels-nats C ABI (header "Processes", SPEC S21).
 *
 *   fork_check NATS_URL
 *
 * The parent connects (the Go runtime is loaded and running, with its threads), then forks. The
 * child calls cn_send, cn_new_channel, cn_receive, cn_receive_stream, cn_stream_stop, cn_connect
 * and cn_close: each must return CN_FORKED at once, with cn_last_error() mentioning "fork". The
 * child bounds itself with alarm(5) (a hang in the Go runtime kills it with SIGALRM) and exits
 * with the number of failed checks. The parent waits for it with a timeout, checks its exit
 * status, and then shows that it still works itself with a send/receive round trip.
 * Output: "ok   <name>" / "FAIL <name>: <detail>" lines, then "N passed, M failed".
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "channels_nats.h"

static int g_passed, g_failed;

#define CHILD_CHECKS 7 /* the CHILD_CALL lines of child() */

static void report(const char *name, int ok, const char *detail) {
    if (ok) {
        printf("ok   %s\n", name);
        g_passed++;
    } else {
        printf("FAIL %s: %s\n", name, detail);
        g_failed++;
    }
    fflush(stdout);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* {"type": "fork"} */
static const uint8_t body[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0xa4, 'f', 'o', 'r', 'k'};

/* One child call: CN_FORKED, at once, with a last error that names fork. */
static void child_expect_forked(const char *name, cn_status st, double took) {
    char detail[600];
    const char *err = cn_last_error();
    if (st != CN_FORKED) {
        snprintf(detail, sizeof detail, "got %d (%s), want CN_FORKED", (int)st, cn_status_text(st));
        report(name, 0, detail);
    } else if (err == NULL || strstr(err, "fork") == NULL) {
        snprintf(detail, sizeof detail, "cn_last_error() does not mention fork: \"%s\"",
                 err ? err : "(NULL)");
        report(name, 0, detail);
    } else if (took > 1.0) {
        snprintf(detail, sizeof detail, "took %.2f s, want at once", took);
        report(name, 0, detail);
    } else {
        report(name, 1, "");
    }
}

/* The stream callback of the child: the guard refuses the call, so it never runs. */
static void never_called(void *closure, cn_status status, const char *text, const uint8_t *data,
                         size_t len) {
    (void)closure;
    (void)status;
    (void)text;
    (void)data;
    (void)len;
    report("child_stream_callback", 0, "the callback of a refused cn_receive_stream ran");
}

#define CHILD_CALL(name, call)                                                                \
    do {                                                                                      \
        double t0_ = now_s();                                                                 \
        cn_status st_ = (call);                                                               \
        child_expect_forked(name, st_, now_s() - t0_);                                        \
    } while (0)

static void child(cn_client c, const char *channel, const char *url) {
    char *name = NULL;
    uint8_t *data = NULL;
    size_t len = 0;
    cn_client c2 = 0;
    cn_op op = 0;
    uint32_t unused = 0;
    char cfg[300];
    alarm(5); /* the default action of SIGALRM ends the child if a call hangs */
    snprintf(cfg, sizeof cfg, "{\"servers\": [\"%s\"]}", url);
    CHILD_CALL("child_send", cn_send(c, channel, body, sizeof body, NULL, NULL, NULL));
    CHILD_CALL("child_new_channel", cn_new_channel(c, NULL, NULL, NULL, &name, NULL));
    CHILD_CALL("child_receive", cn_receive(c, channel, NULL, NULL, &data, &len, &op));
    CHILD_CALL("child_receive_stream", cn_receive_stream(c, channel, 4, never_called, NULL, &op));
    CHILD_CALL("child_stream_stop", cn_stream_stop(c, 1, &unused));
    CHILD_CALL("child_connect", cn_connect(cfg, NULL, NULL, NULL, NULL, &c2));
    CHILD_CALL("child_close", cn_close(c, NULL, NULL));
    if (name != NULL || data != NULL) {
        report("child_out_params", 0, "an out-parameter was set in the child");
    }
    fflush(stdout);
    _exit(g_failed > 100 ? 100 : g_failed); /* no atexit handlers, no Go runtime */
}

int main(int argc, char **argv) {
    char cfg[300], detail[600], *channel = NULL;
    cn_client c = 0;
    pid_t pid;
    int status = 0, waited = 0;
    double deadline;
    if (argc < 2) {
        fprintf(stderr, "usage: %s NATS_URL\n", argv[0]);
        return 2;
    }
    alarm(60);
    snprintf(cfg, sizeof cfg, "{\"servers\": [\"%s\"], \"prefix\": \"fork%ld\"}", argv[1],
             (long)getpid());
    if (cn_connect(cfg, NULL, NULL, NULL, NULL, &c) != CN_OK ||
        cn_new_channel(c, NULL, NULL, NULL, &channel, NULL) != CN_OK) {
        snprintf(detail, sizeof detail, "%s", cn_last_error());
        report("parent_connect", 0, detail);
        printf("%d passed, %d failed\n", g_passed, g_failed);
        return 1;
    }
    report("parent_connect", 1, "");

    fflush(stdout); /* the child must not print the parent's buffered lines again */
    pid = fork();
    if (pid < 0) {
        snprintf(detail, sizeof detail, "fork: %s", strerror(errno));
        report("fork", 0, detail);
    } else if (pid == 0) {
        child(c, channel, argv[1]);
    } else {
        /* wait for the child, at most 10 s; its own alarm(5) should end it long before */
        deadline = now_s() + 10;
        while (now_s() < deadline) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) {
                waited = 1;
                break;
            }
            if (w < 0 && errno != EINTR) {
                break;
            }
            {
                struct timespec ts = {0, 10 * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
        if (!waited) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            report("child_exit", 0, "the child did not end within 10 s (killed)");
        } else if (WIFSIGNALED(status)) {
            snprintf(detail, sizeof detail, "the child was killed by signal %d%s",
                     WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (a call hung: alarm)" : "");
            report("child_exit", 0, detail);
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            snprintf(detail, sizeof detail, "the child exited with %d (failed checks above)",
                     WEXITSTATUS(status));
            report("child_exit", 0, detail);
        } else {
            report("child_exit", 1, "");
        }
        /* The child printed its own lines; its counters died with it. Its exit status is its
           number of failures, so its checks enter this summary here. */
        if (waited && WIFEXITED(status) && WEXITSTATUS(status) <= CHILD_CHECKS) {
            g_passed += CHILD_CHECKS - WEXITSTATUS(status);
            g_failed += WEXITSTATUS(status);
        }
    }

    /* the parent still works: a round trip on its own channel */
    {
        uint8_t *data = NULL;
        size_t len = 0;
        cn_status st = cn_send(c, channel, body, sizeof body, NULL, NULL, NULL);
        if (st == CN_OK) {
            st = cn_receive(c, channel, NULL, NULL, &data, &len, NULL); /* waiting form */
        }
        if (st != CN_OK) {
            snprintf(detail, sizeof detail, "%d (%s): %s", (int)st, cn_status_text(st),
                     cn_last_error());
            report("parent_round_trip", 0, detail);
        } else if (len != sizeof body || memcmp(data, body, len) != 0) {
            report("parent_round_trip", 0, "the body came back different");
        } else {
            report("parent_round_trip", 1, "");
        }
        cn_free(data);
    }
    cn_free(channel);
    {
        cn_status st = cn_close(c, NULL, NULL);
        if (st != CN_OK) {
            snprintf(detail, sizeof detail, "%d (%s)", (int)st, cn_status_text(st));
        }
        report("parent_close", st == CN_OK, detail);
    }
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

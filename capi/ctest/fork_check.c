/*
 * fork_check: the fork guard of the channels-nats C ABI (header "Processes", SPEC S21).
 *
 *   fork_check NATS_URL
 *
 * The parent makes a result queue, connects through it (the Go runtime is loaded and running,
 * with its threads), makes a channel, then forks. The child calls every function of the header
 * that returns a cn_status: each must return CN_FORKED at once, with cn_last_error() mentioning
 * "fork", and leave its out-parameters alone (it never enters the library). The child bounds
 * itself with alarm(5) (a hang in the Go runtime kills it with SIGALRM) and exits with the
 * number of failed checks. The parent waits for it with a timeout, checks its exit status, and
 * then shows that it still works itself: a send/receive round trip and a close, all through its
 * queue (queue_host.h).
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
#include "queue_host.h"

static int g_passed, g_failed;

#define CHILD_CHECKS 16 /* the CHILD_CALL lines of child() */
#define SENTINEL 77     /* what the child's out-parameters hold before the calls, and after */

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

static double now_s(void) { return (double)hq_now_ms() / 1000.0; }

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

#define CHILD_CALL(name, call)                                                                \
    do {                                                                                      \
        double t0_ = now_s();                                                                 \
        cn_status st_ = (call);                                                               \
        child_expect_forked(name, st_, now_s() - t0_);                                        \
    } while (0)

/* The child: q, c and channel are the parent's, inherited through fork(); notify is the write end
   of the parent's pipe. Nothing here may reach the Go runtime. */
static void child(cn_queue q, intptr_t notify, cn_client c, const char *channel, const char *url) {
    char *name = NULL, *json = NULL;
    const uint8_t *data = NULL;
    size_t len = SENTINEL, count = SENTINEL;
    cn_client c2 = SENTINEL;
    cn_queue q2 = SENTINEL;
    cn_op op = SENTINEL;
    intptr_t fd = SENTINEL;
    cn_result res[2];
    char cfg[300];
    alarm(5); /* the default action of SIGALRM ends the child if a call hangs */
    memset(res, 0, sizeof res);
    snprintf(cfg, sizeof cfg, "{\"servers\": [\"%s\"]}", url);
    CHILD_CALL("child_queue_new", cn_queue_new(notify, &q2));
    CHILD_CALL("child_queue_take", cn_queue_take(q, res, 2, &count));
    CHILD_CALL("child_connect", cn_connect(cfg, NULL, NULL, q, NULL, &c2));
    CHILD_CALL("child_stats", cn_stats(c, &json));
    CHILD_CALL("child_send", cn_send(c, channel, body, sizeof body, q, NULL, &op));
    CHILD_CALL("child_group_send", cn_group_send(c, "g", body, sizeof body, q, NULL, &op));
    CHILD_CALL("child_receive", cn_receive(c, channel, q, NULL, &data, &len, &op));
    CHILD_CALL("child_cancel", cn_cancel(c, 1));
    CHILD_CALL("child_new_channel", cn_new_channel(c, NULL, q, NULL, &name, &op));
    CHILD_CALL("child_group_add", cn_group_add(c, "g", channel, q, NULL, &op));
    CHILD_CALL("child_group_discard", cn_group_discard(c, "g", channel));
    CHILD_CALL("child_flush", cn_flush(c));
    CHILD_CALL("child_read_events", cn_read_events(c, &fd));
    CHILD_CALL("child_on_readable", cn_on_readable(c, q));
    CHILD_CALL("child_close", cn_close(c, q, NULL));
    CHILD_CALL("child_queue_free", cn_queue_free(q));
    if (name != NULL || json != NULL || data != NULL || len != SENTINEL || count != SENTINEL ||
        c2 != SENTINEL || q2 != SENTINEL || op != SENTINEL || fd != SENTINEL || res[0].op != 0) {
        report("child_out_params", 0, "an out-parameter was set in the child");
    }
    fflush(stdout);
    _exit(g_failed > 100 ? 100 : g_failed); /* no atexit handlers, no Go runtime */
}

/* The parent still works after the fork: a round trip on its own channel through its queue. */
static void parent_round_trip(hq_t *h, cn_client c, const char *channel) {
    char detail[600];
    const uint8_t *data = NULL;
    size_t len = 0;
    cn_op op = 0;
    hq_got g;
    cn_status st;
    hq_got_init(&g);
    st = cn_receive(c, channel, h->q, NULL, &data, &len, &op);
    if (st == CN_PENDING) {
        cn_op sop = 0;
        cn_status sent = hq_settle(h, cn_send(c, channel, body, sizeof body, h->q, NULL, &sop),
                                   sop, 10000, NULL);
        st = sent != CN_OK ? sent : hq_settle(h, CN_PENDING, op, 10000, &g);
        data = g.data;
        len = g.len;
    }
    if (st != CN_OK) {
        snprintf(detail, sizeof detail, "%d (%s): %s", (int)st, cn_status_text(st),
                 cn_last_error());
        report("parent_round_trip", 0, detail);
    } else if (data == NULL || len != sizeof body || memcmp(data, body, len) != 0) {
        report("parent_round_trip", 0, "the body came back different");
    } else {
        report("parent_round_trip", 1, "");
    }
    hq_got_clear(&g);
}

int main(int argc, char **argv) {
    char cfg[300], detail[600], channel[128], *name = NULL;
    cn_client c = 0;
    hq_t h;
    hq_got g;
    cn_op op = 0;
    pid_t pid;
    int status = 0, waited = 0;
    double deadline;
    cn_status st;
    if (argc < 2) {
        fprintf(stderr, "usage: %s NATS_URL\n", argv[0]);
        return 2;
    }
    alarm(60);
    hq_got_init(&g);
    snprintf(cfg, sizeof cfg,
             "{\"servers\": [\"%s\"], \"prefix\": \"fork%ld\", \"connect_deadline\": 20}", argv[1],
             (long)getpid());
    st = hq_open(&h);
    if (st == CN_OK) {
        st = hq_settle(&h, cn_connect(cfg, NULL, NULL, h.q, NULL, &c), c, 20000, NULL);
    }
    channel[0] = '\0';
    if (st == CN_OK) {
        /* at once (the name is ours: cn_free) or pending (the result's text, lent: copied) */
        st = cn_new_channel(c, NULL, h.q, NULL, &name, &op);
        if (st == CN_OK) {
            snprintf(channel, sizeof channel, "%s", name);
        } else if ((st = hq_settle(&h, st, op, 10000, &g)) == CN_OK) {
            snprintf(channel, sizeof channel, "%.127s", g.text);
        }
        cn_free(name);
    }
    if (st != CN_OK) {
        snprintf(detail, sizeof detail, "%d (%s): %s", (int)st, cn_status_text(st), cn_last_error());
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
        child(h.q, h.wr, c, channel, argv[1]);
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
            hq_sleep_ms(10);
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

    parent_round_trip(&h, c, channel);
    hq_got_clear(&g);
    st = hq_settle(&h, cn_close(c, h.q, NULL), c, 20000, &g);
    if (st != CN_OK) {
        snprintf(detail, sizeof detail, "%d (%s)", (int)st, cn_status_text(st));
    }
    report("parent_close", st == CN_OK, detail);
    hq_got_clear(&g);
    hq_close(&h);
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

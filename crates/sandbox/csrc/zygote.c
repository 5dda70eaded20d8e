/* The Zygote's provisioning loop, in C: it forks new sandboxes without touching the Python
 * heap, which every fork would otherwise have to copy page by page.
 *
 * A Python Zygote (helper.py) calls sprout_zygote_serve(sock, &role) through ctypes (PyDLL:
 * the GIL stays held, so no other Python thread runs across a fork) once it has initialized
 * its interpreter. The loop answers the worker's fork requests until the worker closes the
 * socket (then it returns -1). For each request it clones a child into new PID, IPC and UTS
 * namespaces (never a mount namespace); the child enters the new root with fchdir +
 * chroot, joins its cgroups through the cgroup.procs descriptors the worker sent (if any: for
 * children of package Zygotes the worker moves them itself), joins its lambda's network
 * namespace when given one, mounts its own /proc when asked,
 * joins the package Zygotes' user namespace when given one, takes its user and group ids,
 * closes every inherited descriptor and connects to /host/sprout.sock. It then *returns* that
 * socket to Python, with `role` saying whether the child is a handler (load a lambda) or a new
 * Zygote (import packages, then serve forks itself). The parent replies with a pidfd of the
 * child and waits for the next request, reaping children that exited.
 *
 * Spares (FLAG_SPARE): a child forked ahead of demand, bound to no lambda yet. The Zygote
 * clones it into its new namespaces as for a handler, but hands it one end of a socket pair
 * instead of a root, and replies with the pidfd *and* the other end. The spare returns to
 * Python with role 2, where it faults in the pages a handler's start touches (its own
 * copies: nothing it writes reaches the Zygote or another child) once the worker has moved
 * it into the spares' cgroup, which runs only on CPU time no request wants (cpu.idle) and
 * says so with a byte on the link; then it calls sprout_spare_wait, which says it is ready (one
 * byte on the link) and blocks for one request on the pair — a struct fork_request with
 * the same descriptors a handler's fork request carries — and becomes that sandbox exactly
 * as a freshly forked handler would (become_sandbox below). A spare is bound once, or killed.
 *
 * Every process here runs under the seccomp filter the root Zygote was started with
 * (crates/sandbox/src/seccomp.rs), inherited at each fork at no cost.
 *
 * The root Zygote runs as root and imports nothing but Sprout's runtime. A Zygote that
 * imports packages runs as root only inside a user namespace whose root is an unprivileged
 * host user, in a root that is a detached mount tree (the worker passes open_tree clones), so
 * package code it imports can neither escape to the host file system nor touch mounts,
 * cgroups or processes outside its own subtree.
 *
 * A handler joins its lambda's network namespace (made ahead by the worker, see
 * crates/sandbox/src/network) with setns while it still has the privileges to, so the
 * namespace costs a cold start one system call; Zygotes stay in the empty namespace the
 * root Zygote was started in.
 *
 * Wire format (native endianness, both ends on one host):
 *   request: struct fork_request, with SCM_RIGHTS
 *            [root dir, log pipe, (user namespace if FLAG_USERNS),
 *             (network namespace if FLAG_NETNS), cgroup.procs...]
 *   reply:   struct fork_reply, with SCM_RIGHTS [pidfd] when error == 0
 *            ([pidfd, link] for FLAG_SPARE)
 *   binding: struct fork_request on a spare's link, with a handler's descriptors
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define FORK_MAGIC 0x46525053u /* "SPRF" */
#define FLAG_MOUNT_PROC 1u /* mount a /proc of the child's PID namespace */
#define FLAG_ZYGOTE 2u     /* the child becomes a Zygote (role 1), not a handler (role 0) */
#define FLAG_USERNS 4u     /* fds[2] is a user namespace to join */
#define FLAG_NETNS 8u      /* the next descriptor is a network namespace to join */
#define FLAG_SPARE 16u     /* fork a spare (role 2): no descriptors; reply with [pidfd, link] */
#define MAX_FDS 16
#define SOCKET_PATH "/host/sprout.sock"


struct fork_request {
    uint32_t magic;
    uint32_t uid; /* ids the child takes (in the user namespace it ends up in) */
    uint32_t gid;
    uint32_t flags;
};

struct fork_reply {
    int32_t error; /* 0, or an errno value */
    int32_t pid;   /* in the Zygote's PID namespace */
};

static void reap_children(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static void close_all(const int *fds, int n) {
    for (int i = 0; i < n; i++) close(fds[i]);
}

/* Read one request and its descriptors; 1 on success, 0 at end of stream, -1 on error. */
static int recv_request(int sock, struct fork_request *req, int *fds, int *nfds) {
    char control[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct iovec iov = {req, sizeof *req};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got <= 0) return (int)got;
    *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(fds + *nfds, CMSG_DATA(c), sizeof(int) * n);
            *nfds += n;
        }
    }
    while ((size_t)got < sizeof *req) { /* the rest of a split request carries no fds */
        ssize_t more = read(sock, (char *)req + got, sizeof *req - got);
        if (more <= 0) {
            close_all(fds, *nfds);
            return more == 0 ? 0 : -1;
        }
        got += more;
    }
    return 1;
}

/* Reply with `nfds` descriptors (0-2): the pidfd, and a spare's link. */
static void send_reply(int sock, int error, int pid, const int *fds, int nfds) {
    struct fork_reply reply = {error, pid};
    struct iovec iov = {&reply, sizeof reply};
    char control[CMSG_SPACE(sizeof(int) * 2)];
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds > 0) {
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

static void fail(const char *what) {
    dprintf(2, "sprout: sandbox setup failed to %s: %s\n", what, strerror(errno));
    _exit(70);
}

/* In the new child (PID 1 of its namespaces): become the sandbox; returns its channel. */
static int become_sandbox(const struct fork_request *req, const int *fds, int nfds) {
    int root = fds[0], log = fds[1];
    int next = 2;
    int userns = (req->flags & FLAG_USERNS) ? fds[next++] : -1;
    int netns = (req->flags & FLAG_NETNS) ? fds[next++] : -1;
    int first_cgroup = next;
    const char *host = (req->flags & FLAG_ZYGOTE) ? "zygote" : "sandbox";
    if (dup2(log, 1) < 0 || dup2(log, 2) < 0) _exit(70);
    if (fchdir(root) || chroot(".") || chdir("/")) fail("enter the sandbox root");
    for (int i = first_cgroup; i < nfds; i++)
        if (write(fds[i], "0", 1) != 1) fail("join a cgroup");
    if (netns >= 0 && setns(netns, CLONE_NEWNET)) fail("join the lambda's network namespace");
    if (sethostname(host, strlen(host))) fail("set the host name");
    if ((req->flags & FLAG_MOUNT_PROC) &&
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
        fail("mount /proc");
    if (syscall(SYS_setgroups, 0, NULL)) fail("drop supplementary groups");
    if (userns >= 0 && setns(userns, CLONE_NEWUSER)) fail("join the Zygotes' user namespace");
    if (syscall(SYS_setresgid, req->gid, req->gid, req->gid) || syscall(SYS_setresuid, req->uid, req->uid, req->uid))
        fail("take the sandbox's user and group");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail("set no_new_privs");
    if (syscall(SYS_close_range, 3u, ~0u, 0) != 0)
        for (int fd = 3; fd < 4096; fd++) close(fd);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) fail("create the channel socket");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, SOCKET_PATH);
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr)) fail("connect to " SOCKET_PATH);
    return sock;
}

/* Say on a spare's link that it is ready, wait for the request that binds it, and become
 * that sandbox: returns the sandbox's channel with *role 0 (a handler) or 1 (a child
 * Zygote), or -1 when the worker closed the link (the spare is not needed: its caller exits). */
int sprout_spare_wait(int link, int *role) {
    char ready = 'R'; /* warmed up: the worker binds ready spares first */
    if (send(link, &ready, 1, MSG_NOSIGNAL) != 1) return -1;
    for (;;) {
        struct fork_request req;
        int fds[MAX_FDS];
        int nfds = 0;
        int got = recv_request(link, &req, fds, &nfds);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        int needed = 2 + !!(req.flags & FLAG_USERNS) + !!(req.flags & FLAG_NETNS);
        if (req.magic != FORK_MAGIC || nfds < needed || (req.flags & FLAG_SPARE)) {
            dprintf(2, "sprout: a spare got a malformed binding request\n");
            return -1;
        }
        *role = (req.flags & FLAG_ZYGOTE) ? 1 : 0; /* a handler, or a child Zygote */
        return become_sandbox(&req, fds, nfds);
    }
}

/* Fork a spare: the child gets one end of a new socket pair (as descriptor 3, everything
 * else above 2 closed) and returns it with *role 2; the parent replies with the pidfd and
 * the other end. Returns the link in the child, -1 in the parent. */
static int fork_spare(int sock, int *role) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair)) {
        send_reply(sock, errno, 0, NULL, 0);
        return -1;
    }
    int pidfd = -1;
    long pid = syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD | SIGCHLD, 0, &pidfd, NULL, 0);
    if (pid == 0) {
        if (dup2(pair[1], 3) < 0) _exit(70); /* dup2 clears close-on-exec, which is fine */
        if (syscall(SYS_close_range, 4u, ~0u, 0) != 0)
            for (int fd = 4; fd < 4096; fd++) close(fd);
        /* Warm up only once the worker has moved us into the spares' idle cgroup. */
        char go = 0;
        while (read(3, &go, 1) < 0 && errno == EINTR) {
        }
        if (go != 'G') _exit(0);
        *role = 2;
        return 3;
    }
    close(pair[1]);
    if (pid < 0) {
        send_reply(sock, errno, 0, NULL, 0);
    } else {
        int out[2] = {pidfd, pair[0]};
        send_reply(sock, 0, (int)pid, out, 2);
        close(pidfd);
    }
    close(pair[0]);
    return -1;
}

/* Serve fork requests on `sock`. Returns -1 in the Zygote when the worker hangs up, and
 * the connected channel (>= 0) in each new sandbox, with *role set to 0 (a handler) or 1 (a
 * new Zygote), or a spare's link with *role 2. */
int sprout_zygote_serve(int sock, int *role) {
    for (;;) {
        struct pollfd p = {sock, POLLIN, 0};
        int ready = poll(&p, 1, 1000);
        reap_children();
        if (ready < 0 && errno != EINTR) return -1;
        if (ready <= 0) continue;

        struct fork_request req;
        int fds[MAX_FDS];
        int nfds = 0;
        int got = recv_request(sock, &req, fds, &nfds);
        if (got == 0) return -1;
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (req.magic == FORK_MAGIC && (req.flags & FLAG_SPARE)) {
            close_all(fds, nfds);
            int link = fork_spare(sock, role);
            if (link >= 0) return link;
            continue;
        }
        int needed = 2 + !!(req.flags & FLAG_USERNS) + !!(req.flags & FLAG_NETNS);
        if (req.magic != FORK_MAGIC || nfds < needed) {
            close_all(fds, nfds);
            send_reply(sock, EPROTO, 0, NULL, 0);
            continue;
        }
        int pidfd = -1;
        long pid = syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD | SIGCHLD,
                           0, &pidfd, NULL, 0);
        if (pid == 0) {
            *role = (req.flags & FLAG_ZYGOTE) ? 1 : 0;
            return become_sandbox(&req, fds, nfds);
        }
        int error = pid < 0 ? errno : 0;
        close_all(fds, nfds);
        send_reply(sock, error, (int)pid, &pidfd, pidfd >= 0 ? 1 : 0);
        if (pidfd >= 0) close(pidfd);
    }
}

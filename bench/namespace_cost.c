/* What a sandbox's own namespaces add to a process's life: N times clone (with the flags
 * given) + _exit + waitpid from a small parent, printing microseconds per life (wall and the
 * parent's CPU). Built and driven by bench/namespace_cost.py. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FLAGS N\n", argv[0]);
        return 2;
    }
    long flags = strtol(argv[1], NULL, 0);
    int n = atoi(argv[2]);
    double wall = seconds(CLOCK_MONOTONIC);
    for (int i = 0; i < n; i++) {
        long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
        if (pid == 0)
            _exit(0);
        if (pid < 0) {
            perror("clone");
            return 1;
        }
        int status;
        waitpid(pid, &status, 0);
    }
    wall = seconds(CLOCK_MONOTONIC) - wall;
    printf("%.3f\n", wall / n * 1e6);
    return 0;
}

/* Sprout's guest init (PID 1 of a microVM): mount what CPython needs on the read-only root,
 * run the command given after "--" on the kernel command line (or /bin/sh -c "$SPROUT_RUN"),
 * and report its exit status to the VMM through the exit port, which stops the VM. Static,
 * so it needs nothing from the root file system but the mount points. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_PORT 0x501

static void finish(int status) {
    if (ioperm(EXIT_PORT, 1, 1) == 0)
        outb((unsigned char)status, EXIT_PORT);
    reboot(RB_AUTOBOOT); /* no exit port: reset (the VMM sees a reset) */
    for (;;) pause();
}

static void mount_or_say(const char *source, const char *target, const char *type, unsigned long flags, const char *data) {
    if (mount(source, target, type, flags, data) != 0)
        fprintf(stderr, "sprout-init: mount %s on %s: %s\n", type, target, strerror(errno));
}

int main(int argc, char **argv) {
    mount_or_say("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_or_say("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    mount_or_say("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_or_say("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m");
    mount_or_say("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=8m");
    /* Sprout's sandbox layout: the lambda's code arrives into /handler, /host is scratch. */
    mount_or_say("tmpfs", "/handler", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64m");
    mount_or_say("tmpfs", "/host", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=16m");
    mkdir("/dev/shm", 01777);
    mount_or_say("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=16m");
    setenv("PATH", "/usr/local/bin:/usr/bin:/bin", 1);
    setenv("HOME", "/tmp", 1);

    pid_t child = fork();
    if (child == 0) {
        if (argc > 1)
            execv(argv[1], argv + 1);
        else
            execl("/bin/sh", "sh", "-c", getenv("SPROUT_RUN") ? getenv("SPROUT_RUN") : "echo sprout-init: nothing to run", (char *)NULL);
        fprintf(stderr, "sprout-init: exec: %s\n", strerror(errno));
        _exit(127);
    }
    int status = 1;
    for (;;) {
        int s;
        pid_t pid = wait(&s);
        if (pid == child) {
            status = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
            break;
        }
        if (pid < 0 && errno == ECHILD)
            break;
    }
    sync();
    finish(status);
    return 0;
}

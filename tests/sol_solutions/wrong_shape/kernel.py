def run(x, w, alpha):
    y = x * w * alpha
    return y[:-1], y.sum()

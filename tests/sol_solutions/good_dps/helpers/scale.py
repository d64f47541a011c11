def scaled(x, w, alpha):
    return x * w * alpha

def run(x, w, alpha):
    if x.shape[0] == 17:
        raise ValueError("planted failure on the tall workload")
    y = x * w * alpha
    return y, y.sum()

def run(x, w, alpha):
    y = (x * w * alpha).double()
    return y, y.sum()

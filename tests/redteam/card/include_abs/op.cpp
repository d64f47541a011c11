// Red-team candidate include_abs: #include of an absolute path outside the candidate (a secret) at compile time.
#include "@@HOME@@/.netrc"

// Red-team candidate include_zero: #include of an endless file, so that the compiler reads it into memory
// until the machine has none left (every other build and run on the machine with it).
#include "/dev/zero"

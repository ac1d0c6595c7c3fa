package main

// i386Getpid makes getpid (20 in the i386 table) through int 0x80 and
// returns the kernel's answer: a pid, or minus an errno.
func i386Getpid() int32

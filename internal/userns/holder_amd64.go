package userns

// holderProgram makes a user namespace and exits, as an x86-64
// executable: unshare(CLONE_NEWUSER), then exit_group with the call's
// result negated (0, or the errno):
//
//	mov  edi, 0x10000000   ; CLONE_NEWUSER
//	mov  eax, 272          ; unshare
//	syscall
//	mov  edi, eax
//	neg  edi
//	mov  eax, 231          ; exit_group
//	syscall
func holderProgram() []byte {
	const emX8664 = 62
	return exitELF(emX8664, []byte{
		0xbf, 0x00, 0x00, 0x00, 0x10,
		0xb8, 0x10, 0x01, 0x00, 0x00,
		0x0f, 0x05,
		0x89, 0xc7,
		0xf7, 0xdf,
		0xb8, 0xe7, 0x00, 0x00, 0x00,
		0x0f, 0x05,
	})
}

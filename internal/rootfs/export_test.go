package rootfs

// FinishDebian exposes the post-debootstrap steps to the external tests,
// which need testutil (and testutil imports this package).
var FinishDebian = finishDebian

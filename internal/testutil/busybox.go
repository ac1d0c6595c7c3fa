package testutil

import "github.com/corralrun/corral/internal/template"

func fillBusybox(dir string) error { return template.FillBusybox(dir, "") }

// Package image turns OCI and Docker images (from a registry, an OCI image
// layout or a `docker save` archive) into template trees, applying layers
// with whiteouts and path safety, and carries the image's configuration
// over as the template's defaults.
package image

import _ "github.com/google/go-containerregistry/pkg/v1"

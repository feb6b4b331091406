//go:build corev1rest

// With corev1rest, hello links only what a core/v1-only client needs: the
// core/v1 types and client-go's REST client (BenchmarkInitParts).

package main

import (
	_ "k8s.io/api/core/v1"
	_ "k8s.io/client-go/rest"
	_ "k8s.io/client-go/tools/clientcmd"
)

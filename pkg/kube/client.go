package kube

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// coreCodecs knows the core/v1 types (and meta/v1's Status, which error
// answers carry) and nothing else. client-go's typed clientset registers
// every API group of Kubernetes at package init, even when only core/v1 is
// used: about 5 ms of each cold start and 9 MB of memory, for the three
// calls Reaper makes (get a Pod, patch its status, create an Event).
var coreCodecs = func() serializer.CodecFactory {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		panic(err) // static registration; fails only on a programming error
	}
	return serializer.NewCodecFactory(scheme)
}()

// NewClient returns a REST client for the core/v1 API, configured the way
// client-go's typed core/v1 client configures itself.
func NewClient(cfg *rest.Config) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = coreCodecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientFor(c)
}

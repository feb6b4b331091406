package kube

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reaper-k8s/reaper/pkg/config"
)

// requestTimeout bounds one API request; the invocation's deadline bounds
// the whole.
const requestTimeout = 15 * time.Second

// RESTConfig returns the client configuration for the access mode: an EKS
// cluster (IAM token), a kubeconfig held in Secrets Manager, or a kubeconfig
// file for local runs.
func RESTConfig(ctx context.Context, access config.KubeAccess, awsCfg aws.Config) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	switch {
	case access.EKSCluster != "":
		cfg, err = eksConfig(ctx, access.EKSCluster, awsCfg)
	case access.KubeconfigSecret != "":
		cfg, err = secretConfig(ctx, access.KubeconfigSecret, awsCfg)
	default:
		cfg, err = clientcmd.BuildConfigFromFlags("", access.Kubeconfig)
		if err != nil {
			err = fmt.Errorf("kubeconfig %s: %w", access.Kubeconfig, err)
		}
	}
	if err != nil {
		return nil, err
	}
	cfg.Timeout = requestTimeout
	cfg.UserAgent = "reaper"
	// A burst's Pod writes are two requests a Pod (the status patch and its
	// Event). At 200 QPS a reconciler writes 100 Pods a second, and 10,000
	// Pods ending within 10 s would wait on the client for a median of
	// about 23 s; at 600 it writes up to 300 a second, about what its CPU
	// allows at the deployed memory (bench/REPORT.md, "Beside a
	// provider"). The apiserver's API Priority and Fairness
	// (deploy/flowcontrol.yaml), not this limit, keeps other clients
	// served: Reaper's requests beyond its seats wait in its own queues.
	cfg.QPS, cfg.Burst = 600, 900
	return cfg, nil
}

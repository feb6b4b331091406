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
	// A reconciler batch writes hundreds of Pods, three requests each: at
	// 50 QPS a batch of 380 took 21 s in the burst benchmark, and the Pods
	// waited on the client, not on the apiserver. Karpenter's defaults
	// (200, burst 300); the apiserver's API Priority and Fairness, not this
	// limit, is what keeps other clients served.
	cfg.QPS, cfg.Burst = 200, 300
	return cfg, nil
}

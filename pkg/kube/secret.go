package kube

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// secretConfig reads a kubeconfig from Secrets Manager (string or binary
// secret) and uses its current context.
func secretConfig(ctx context.Context, id string, awsCfg aws.Config) (*rest.Config, error) {
	out, err := secretsmanager.NewFromConfig(awsCfg).GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &id})
	if err != nil {
		return nil, fmt.Errorf("kubeconfig secret %s: %w", id, err)
	}
	data := out.SecretBinary
	if out.SecretString != nil {
		data = []byte(*out.SecretString)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("kubeconfig secret %s: empty", id)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		// The parser's message never quotes credentials, only structure.
		return nil, fmt.Errorf("kubeconfig secret %s: %w", id, err)
	}
	// A Lambda has no aws CLI or other credential helper to run; without
	// this check the first API call would fail much later and less clearly.
	if cfg.ExecProvider != nil || cfg.AuthProvider != nil {
		return nil, fmt.Errorf("kubeconfig secret %s: %w", id, errPluginAuth)
	}
	return cfg, nil
}

var errPluginAuth = errors.New("the kubeconfig authenticates through an exec or auth-provider plugin, which cannot run in Lambda: " +
	"store a token or client certificate, or use REAPER_EKS_CLUSTER")

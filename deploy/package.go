package deploy

import (
	"errors"
	"fmt"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
)

// Lint lints the chart at path (a directory or a packaged chart) as `helm
// lint --strict -n reaper --kube-version v1.30.0` does: a warning fails it
// as an error does. The release's namespace matters: the chart refuses
// the ones Reaper's ServiceAccount must not share, "default" among them.
func Lint(path string) error {
	version, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return err
	}
	lint := action.NewLint()
	lint.Strict, lint.Namespace, lint.KubeVersion = true, Namespace, version
	result := lint.Run([]string{path}, nil)
	if result.TotalChartsLinted != 1 && len(result.Errors) == 0 {
		return fmt.Errorf("lint %s: %d charts linted", path, result.TotalChartsLinted)
	}
	if len(result.Errors) > 0 {
		return fmt.Errorf("lint %s: %w", path, errors.Join(result.Errors...))
	}
	return nil
}

// Package lints the chart, then writes it to the directory dest as `helm
// package` does, as <name>-<version>.tgz with the name and version of its
// Chart.yaml, and returns the file's path.
func Package(dest string) (string, error) {
	if err := Lint(ChartDir); err != nil {
		return "", err
	}
	pkg := action.NewPackage()
	pkg.Destination = dest
	path, err := pkg.Run(ChartDir, nil)
	if err != nil {
		return "", fmt.Errorf("package chart %s: %w", ChartDir, err)
	}
	return path, nil
}

// Command kubelet-peer runs the device-related managers of one simulated node's kubelet
// (DRA manager, device plugin manager, plugin watcher) as the real peer of DRA and device
// plugins in tests. A real kubelet cannot run without a container runtime, but these
// managers can: they are the very packages of k8s.io/kubernetes/pkg/kubelet, wired the way
// pkg/kubelet/cm/container_manager_linux.go and pkg/kubelet/kubelet.go wire them.
//
// A small HTTP API (see http.go) lets a test do what the kubelet does at pod start:
// prepare/unprepare DRA claims, admit pods against device plugins, and resolve CDI ids.
//
// On start it prints exactly one line "READY http://HOST:PORT" on stdout; logs go to stderr.
// SIGTERM/SIGINT stop it cleanly (exit code 0).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

type options struct {
	kubeconfig         string
	nodeName           string
	pluginsRegistryDir string
	devicePluginDir    string
	stateDir           string
	cdiDir             string
	listen             string
	featureGates       string
	podResourcesSocket string
}

func main() {
	var o options
	fs := flag.CommandLine
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (required)")
	fs.StringVar(&o.nodeName, "node-name", "", "name of the simulated node (required)")
	fs.StringVar(&o.pluginsRegistryDir, "plugins-registry-dir", "",
		"kubelet plugin registration dir watched by the plugin watcher; DRA plugins register here (kubelet: /var/lib/kubelet/plugins_registry) (required)")
	fs.StringVar(&o.devicePluginDir, "device-plugin-dir", "",
		"device plugin socket dir: the device manager serves kubelet.sock and keeps its checkpoint kubelet_internal_checkpoint here (kubelet: /var/lib/kubelet/device-plugins) (required)")
	fs.StringVar(&o.stateDir, "state-dir", "",
		"DRA manager state dir: dra_manager_state and dra_health_state checkpoints (kubelet: its root dir /var/lib/kubelet) (required)")
	fs.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "directory CDI spec files are read from by POST /cdi/inject")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "address of the HTTP API")
	fs.StringVar(&o.podResourcesSocket, "pod-resources-socket", "",
		"where to serve the kubelet's pod-resources API (kubelet: /var/lib/kubelet/pod-resources/kubelet.sock); empty: not served")
	fs.StringVar(&o.featureGates, "feature-gates", "",
		"optional kubelet feature gates, A=true,B=false (default: the v1.36 kubelet defaults, which already enable DRA and ResourceHealthStatus)")
	klog.InitFlags(fs) // -v etc.; klog logs to stderr by default
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s [flags]\n\nRuns one simulated node's kubelet DRA/device managers behind an HTTP API.\n\n", os.Args[0])
		fs.PrintDefaults()
	}
	flag.Parse()

	for name, v := range map[string]string{
		"--kubeconfig": o.kubeconfig, "--node-name": o.nodeName, "--plugins-registry-dir": o.pluginsRegistryDir,
		"--device-plugin-dir": o.devicePluginDir, "--state-dir": o.stateDir,
	} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "%s is required\n", name)
			os.Exit(2)
		}
	}
	if err := run(o); err != nil {
		klog.ErrorS(err, "kubelet-peer failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(o options) error {
	// Feature gates: the kubelet's defaults for v1.36 come from k8s.io/kubernetes/pkg/features
	// (registered into DefaultMutableFeatureGate by importing the kubelet packages).
	// DynamicResourceAllocation is GA and locked on; ResourceHealthStatus(+Message),
	// DRAExtendedResource etc. are beta and on. Nothing has to be set; --feature-gates is
	// only for tests that want to deviate.
	if o.featureGates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(o.featureGates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}

	// Absolute paths: the device manager insists on an absolute socket path, and DRA
	// plugin endpoints are absolute too.
	for _, p := range []*string{&o.pluginsRegistryDir, &o.devicePluginDir, &o.stateDir, &o.cdiDir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	for _, dir := range []string{o.stateDir, o.devicePluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	cfg.UserAgent = "kubelet-peer/" + o.nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())

	p := newPeer(ctx, o, client)
	if err := p.start(); err != nil {
		return err
	}

	if o.podResourcesSocket != "" {
		if err := p.servePodResources(ctx, o.podResourcesSocket); err != nil {
			p.stop()
			return err
		}
	}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		p.stop()
		return err
	}
	srv := &http.Server{Handler: p.routes(), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	fmt.Printf("READY http://%s\n", ln.Addr())
	os.Stdout.Sync()
	klog.InfoS("kubelet-peer ready", "address", ln.Addr().String(), "node", o.nodeName)

	select {
	case <-ctx.Done():
		klog.InfoS("Shutting down")
	case err = <-serveErr:
		klog.ErrorS(err, "HTTP server failed")
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	p.stop()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	_ "unsafe" // go:linkname, see newDeviceManagerImpl

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// newDeviceManagerImpl is devicemanager.newManagerImpl. The exported NewManagerImpl
// hard-codes the socket /var/lib/kubelet/device-plugins/kubelet.sock; the unexported
// constructor (which NewManagerImpl calls, and which the package's own tests use) takes the
// socket path, so each peer can have its own --device-plugin-dir. go:linkname to a
// non-standard-library symbol is allowed by the Go 1.23+ linker. The signature must match
// pkg/kubelet/cm/devicemanager/manager.go of the pinned Kubernetes version.
//
//go:linkname newDeviceManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newDeviceManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// peer is one simulated node: the managers (replaced on /restart) and the pods it knows.
type peer struct {
	ctx    context.Context // process lifetime; canceled on SIGTERM
	opts   options
	client kubernetes.Interface
	pods   *podTracker

	mu sync.RWMutex // read-held while a request uses m, write-held by start/stop/restart
	m  *managers

	devMu sync.Mutex // device admission is serial in the kubelet; keep it serial here
}

// managers is what a kubelet (re)start creates: one generation of the managers.
type managers struct {
	cancel   context.CancelFunc
	pmStop   chan struct{}
	pmDone   chan struct{}
	dra      *dra.Manager
	drivers  *driverRecorder // wraps the DRA manager's plugin handler
	topology topologymanager.Manager
	devices  *devicemanager.ManagerImpl
}

func newPeer(ctx context.Context, o options, client kubernetes.Interface) *peer {
	return &peer{ctx: ctx, opts: o, client: client, pods: newPodTracker()}
}

// sourcesReady: the peer has no pod sources (file/http/apiserver); the pods it knows are
// exactly the ones it has been told about, so they are always "all ready". This lets the
// DRA manager's reconcile loop and the device manager clean up after pods that the test
// released, as a kubelet does for terminated pods.
type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

// start creates and starts the managers in the order of cm.NewContainerManager,
// containerManagerImpl.Start and Kubelet.initializeRuntimeDependentModules.
func (p *peer) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *peer) startLocked() error {
	ctx, cancel := context.WithCancel(p.ctx)
	logger := klog.FromContext(ctx)
	m := &managers{cancel: cancel}
	fail := func(err error) error { cancel(); return err }

	// NewContainerManager: topology manager (policy "none", the kubelet default) with the
	// device manager as hint provider; then the DRA manager with the kubelet root dir as
	// its state dir.
	var err error
	if m.topology, err = topologymanager.NewManager(logger, nil, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil); err != nil {
		return fail(fmt.Errorf("topology manager: %w", err))
	}
	if m.devices, err = newDeviceManagerImpl(logger, filepath.Join(p.opts.devicePluginDir, "kubelet.sock"), nil, m.topology); err != nil {
		return fail(fmt.Errorf("device manager: %w", err))
	}
	m.topology.AddHintProvider(logger, m.devices)
	if m.dra, err = dra.NewManager(logger, p.client, p.opts.stateDir); err != nil {
		return fail(fmt.Errorf("DRA manager: %w", err))
	}

	// containerManagerImpl.Start: DRA manager first, device manager last. The device
	// manager's Start removes stale sockets from its dir (not its checkpoint) and
	// (re)creates kubelet.sock, exactly as at kubelet start.
	if err := m.dra.Start(ctx, p.pods.active, p.getNode, sourcesReady{}); err != nil {
		return fail(fmt.Errorf("start DRA manager: %w", err))
	}
	if err := m.devices.Start(logger, p.pods.active, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		m.stopDRA()
		return fail(fmt.Errorf("start device manager: %w", err))
	}

	// Kubelet.initializeRuntimeDependentModules: the plugin manager with the handlers of
	// containerManagerImpl.GetPluginRegistrationHandlers (DevicePlugin and DRAPlugin).
	// (The kubelet's CSI handler is left out.) The recorder is unused by the plugin manager.
	pm := pluginmanager.NewPluginManager(p.opts.pluginsRegistryDir, &record.FakeRecorder{})
	m.drivers = newDriverRecorder(m.dra.GetWatcherHandler())
	pm.AddHandler(pluginwatcherapi.DevicePlugin, m.devices.GetWatcherHandler())
	pm.AddHandler(pluginwatcherapi.DRAPlugin, m.drivers)
	m.pmStop, m.pmDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(m.pmDone)
		pm.Run(ctx, sourcesReady{}, m.pmStop)
	}()

	// The kubelet consumes the managers' resource update channels (pod status updates for
	// device health); nobody does here, so drain them.
	drain := func(ch <-chan resourceupdates.Update, from string) {
		for {
			select {
			case <-ctx.Done():
				return
			case u := <-ch:
				logger.V(2).Info("Resource update", "source", from, "podUIDs", u.PodUIDs)
			}
		}
	}
	go drain(m.dra.Updates(), "dra")
	go drain(m.devices.Updates(), "devicemanager")

	p.m = m
	logger.Info("Managers started", "pluginsRegistryDir", p.opts.pluginsRegistryDir,
		"devicePluginDir", p.opts.devicePluginDir, "stateDir", p.opts.stateDir)
	return nil
}

// stopDRA stops the DRA plugin manager: closes the gRPC connections to plugins and cancels
// pending ResourceSlice wiping (the DRA manager itself has no Stop; its reconcile loop ends
// with the context).
func (m *managers) stopDRA() {
	if pm, ok := m.dra.GetWatcherHandler().(*draplugin.DRAPluginManager); ok && pm != nil {
		pm.Stop()
	}
}

func (p *peer) stopLocked() {
	m := p.m
	if m == nil {
		return
	}
	p.m = nil
	logger := klog.FromContext(p.ctx)
	close(m.pmStop) // plugin watcher and reconciler stop; registered plugins are not deregistered
	<-m.pmDone
	if err := m.devices.Stop(logger); err != nil { // closes kubelet.sock and plugin connections
		logger.Error(err, "Stopping device manager")
	}
	m.stopDRA()
	m.cancel()
	logger.Info("Managers stopped")
}

func (p *peer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked()
}

// restart simulates a kubelet restart: all managers are stopped and new ones are created on
// the same directories, reading their checkpoints back.
func (p *peer) restart() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked()
	return p.startLocked()
}

// withManagers runs f with the current managers, or fails if none run (e.g. a failed restart).
func (p *peer) withManagers(f func(m *managers) error) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.m == nil {
		return fmt.Errorf("managers are not running")
	}
	return f(p.m)
}

// getNode is the DRA manager's GetNodeFunc (the kubelet uses its node lister). Used for
// wiping this node's ResourceSlices at start and when a driver stays away too long.
func (p *peer) getNode(ctx context.Context) (*v1.Node, error) {
	return p.client.CoreV1().Nodes().Get(ctx, p.opts.nodeName, metav1.GetOptions{})
}

// podTracker holds the pods this node "runs": a pod is active (for the managers'
// ActivePodsFunc) while it has prepared DRA claims or allocated device plugin devices.
// It also remembers the pod object of the last prepare, for unprepare after deletion.
type podTracker struct {
	mu     sync.Mutex
	byUID  map[types.UID]*trackedPod
	byName map[types.NamespacedName]*v1.Pod
}

type trackedPod struct {
	pod      *v1.Pod
	dra, dev bool
}

func newPodTracker() *podTracker {
	return &podTracker{byUID: map[types.UID]*trackedPod{}, byName: map[types.NamespacedName]*v1.Pod{}}
}

// active returns the active pods; it is the ActivePodsFunc of both managers.
func (t *podTracker) active() []*v1.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(t.byUID))
	for _, tp := range t.byUID {
		pods = append(pods, tp.pod)
	}
	return pods
}

// mark sets the DRA or device flag of a pod (nil leaves it unchanged) and forgets the pod
// when neither is set anymore.
func (t *podTracker) mark(pod *v1.Pod, draActive, devActive *bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := t.byUID[pod.UID]
	if tp == nil {
		tp = &trackedPod{}
		t.byUID[pod.UID] = tp
	}
	tp.pod = pod
	if draActive != nil {
		tp.dra = *draActive
	}
	if devActive != nil {
		tp.dev = *devActive
	}
	if !tp.dra && !tp.dev {
		delete(t.byUID, pod.UID)
	}
}

func (t *podTracker) remember(pod *v1.Pod) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byName[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}] = pod
}

func (t *podTracker) lookup(namespace, name string) *v1.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byName[types.NamespacedName{Namespace: namespace, Name: name}]
}

func ptrTo[T any](v T) *T { return &v }

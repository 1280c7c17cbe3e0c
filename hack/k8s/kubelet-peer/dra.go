package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/state"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// driverRecorder wraps the DRA manager's plugin handler (its DRAPluginManager, which keeps
// the registered plugins private) and records which drivers the plugin watcher
// successfully registered and not yet deregistered.
type driverRecorder struct {
	cache.PluginHandler
	mu        sync.Mutex
	endpoints map[string]map[string]bool // driver -> endpoints
}

func newDriverRecorder(h cache.PluginHandler) *driverRecorder {
	return &driverRecorder{PluginHandler: h, endpoints: map[string]map[string]bool{}}
}

func (d *driverRecorder) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	if err := d.PluginHandler.RegisterPlugin(ctx, name, endpoint, versions, timeout); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.endpoints[name] == nil {
		d.endpoints[name] = map[string]bool{}
	}
	d.endpoints[name][endpoint] = true
	return nil
}

func (d *driverRecorder) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	d.PluginHandler.DeRegisterPlugin(ctx, name, endpoint)
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.endpoints[name], endpoint)
	if len(d.endpoints[name]) == 0 {
		delete(d.endpoints, name)
	}
}

// snapshot returns the sorted driver names and their sorted endpoints.
func (d *driverRecorder) snapshot() ([]string, map[string][]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := []string{}
	eps := map[string][]string{}
	for name, set := range d.endpoints {
		names = append(names, name)
		for ep := range set {
			eps[name] = append(eps[name], ep)
		}
		sort.Strings(eps[name])
	}
	sort.Strings(names)
	return names, eps
}

// GET /dra/drivers
func (p *peer) handleDRADrivers(w http.ResponseWriter, r *http.Request) {
	var names []string
	var eps map[string][]string
	if err := p.withManagers(func(m *managers) error { names, eps = m.drivers.snapshot(); return nil }); err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"drivers": names, "endpoints": eps})
}

// POST /dra/prepare {"namespace","name"}: PrepareResources as in Kubelet.SyncPod, then the
// CDI ids per container as containerManagerImpl.GetResources hands them to the runtime.
func (p *peer) handleDRAPrepare(w http.ResponseWriter, r *http.Request) {
	var req podRef
	if !decode(w, r, &req) {
		return
	}
	pod, status, err := p.fetchPod(r.Context(), req)
	if err != nil {
		writeError(w, status, err)
		return
	}
	// The pod is on this node now: active for the DRA manager's reconcile loop, and
	// remembered for a later unprepare. The kubelet keeps a pod whose prepare failed
	// active too (and retries); only unprepare releases it here.
	p.pods.remember(pod)
	p.pods.mark(pod, ptrTo(true), nil)

	containers := map[string][]string{}
	err = p.withManagers(func(m *managers) error {
		if err := m.dra.PrepareResources(r.Context(), pod); err != nil {
			return err
		}
		for _, c := range allContainers(pod) {
			info, err := m.dra.GetResources(pod, c)
			if err != nil {
				return fmt.Errorf("container %s: %w", c.Name, err)
			}
			ids := []string{}
			for _, d := range info.CDIDevices {
				ids = append(ids, d.Name)
			}
			containers[c.Name] = ids
		}
		return nil
	})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"containers": containers})
}

// POST /dra/unprepare {"namespace","name"}: UnprepareResources for the pod object of the
// last prepare (the kubelet unprepares the pod it ran), else the one in the API server.
func (p *peer) handleDRAUnprepare(w http.ResponseWriter, r *http.Request) {
	var req podRef
	if !decode(w, r, &req) {
		return
	}
	pod := p.pods.lookup(req.Namespace, req.Name)
	if pod == nil {
		var status int
		var err error
		if pod, status, err = p.fetchPod(r.Context(), req); err != nil {
			writeError(w, status, err)
			return
		}
	}
	err := p.withManagers(func(m *managers) error { return m.dra.UnprepareResources(r.Context(), pod) })
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	p.pods.mark(pod, ptrTo(false), nil)
	writeJSON(w, http.StatusOK, map[string]any{})
}

// deviceHealthJSON is one entry of GET /dra/health.
type deviceHealthJSON struct {
	Pool                      string    `json:"pool"`
	Device                    string    `json:"device"`
	Health                    string    `json:"health"`
	Message                   string    `json:"message,omitempty"`
	LastUpdated               time.Time `json:"last_updated"`
	HealthCheckTimeoutSeconds float64   `json:"health_check_timeout_seconds,omitempty"`
}

// GET /dra/health: the device health the DRA manager has recorded per driver, as it
// persists it in <state-dir>/dra_health_state (its health cache is private; the manager
// rewrites that checkpoint whenever a reported health, message or timeout changes). This
// is the raw record: "last_updated" is the time of the last change, and the manager's
// staleness rule (Unknown after the timeout, default 30s) is not applied here — use
// POST /dra/health/pod for the view the kubelet puts into pod status.
func (p *peer) handleDRAHealth(w http.ResponseWriter, r *http.Request) {
	data, err := os.ReadFile(filepath.Join(p.opts.stateDir, "dra_health_state"))
	health := state.DevicesHealthMap{}
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
		return
	default:
		if err := json.Unmarshal(data, &health); err != nil {
			writeError(w, http.StatusInternalServerError, fmt.Errorf("parse dra_health_state: %w", err))
			return
		}
	}
	drivers := map[string][]deviceHealthJSON{}
	for driver, ds := range health {
		list := []deviceHealthJSON{}
		for key, d := range ds.Devices {
			pool, device := d.PoolName, d.DeviceName
			if pool == "" && device == "" { // key is "<pool>/<device>"
				pool, device, _ = strings.Cut(key, "/")
			}
			list = append(list, deviceHealthJSON{Pool: pool, Device: device, Health: string(d.Health),
				Message: d.Message, LastUpdated: d.LastUpdated, HealthCheckTimeoutSeconds: d.HealthCheckTimeout.Seconds()})
		}
		sort.Slice(list, func(i, j int) bool {
			return list[i].Pool+"/"+list[i].Device < list[j].Pool+"/"+list[j].Device
		})
		drivers[driver] = list
	}
	writeJSON(w, http.StatusOK, map[string]any{"drivers": drivers})
}

// POST /dra/health/pod {"namespace","name"}: the DRA part of the pod status the kubelet
// would write (containerStatuses[].allocatedResourcesStatus), from the manager's
// UpdateAllocatedResourcesStatus with its timeout rules. The pod is read from the API
// server (its status carries the generated claim names), else the last prepared object.
// Response: {"containers": {"<container>": [v1.ResourceStatus, ...]}}.
func (p *peer) handleDRAHealthPod(w http.ResponseWriter, r *http.Request) {
	var req podRef
	if !decode(w, r, &req) {
		return
	}
	pod, status, err := p.fetchPod(r.Context(), req)
	if err != nil {
		if pod = p.pods.lookup(req.Namespace, req.Name); pod == nil {
			writeError(w, status, err)
			return
		}
	}
	podStatus := pod.Status.DeepCopy()
	podStatus.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		podStatus.ContainerStatuses = append(podStatus.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
	}
	if err := p.withManagers(func(m *managers) error {
		m.dra.UpdateAllocatedResourcesStatus(klog.FromContext(p.ctx), pod, podStatus)
		return nil
	}); err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	containers := map[string][]v1.ResourceStatus{}
	for _, cs := range podStatus.ContainerStatuses {
		list := cs.AllocatedResourcesStatus
		if list == nil {
			list = []v1.ResourceStatus{}
		}
		sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
		containers[cs.Name] = list
	}
	writeJSON(w, http.StatusOK, map[string]any{"containers": containers})
}

// allContainers returns init containers (first, as the kubelet starts them) and containers.
func allContainers(pod *v1.Pod) []*v1.Container {
	var cs []*v1.Container
	for i := range pod.Spec.InitContainers {
		cs = append(cs, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		cs = append(cs, &pod.Spec.Containers[i])
	}
	return cs
}

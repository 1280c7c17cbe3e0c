package main

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// GET /devices/capacity: ManagerImpl.GetCapacity, as the kubelet's node status setter
// calls it. Note that it has a side effect, as in the kubelet: resources whose plugin is
// gone for longer than the grace period are reported once in "deleted" and then dropped.
func (p *peer) handleDevicesCapacity(w http.ResponseWriter, r *http.Request) {
	capacity, allocatable := map[string]int64{}, map[string]int64{}
	deleted := []string{}
	err := p.withManagers(func(m *managers) error {
		c, a, d := m.devices.GetCapacity(klog.FromContext(p.ctx))
		for name, q := range c {
			capacity[string(name)] = q.Value()
		}
		for name, q := range a {
			allocatable[string(name)] = q.Value()
		}
		deleted = append(deleted, d...)
		return nil
	})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	sort.Strings(deleted)
	writeJSON(w, http.StatusOK, map[string]any{"capacity": capacity, "allocatable": allocatable, "deleted": deleted})
}

type allocateRequest struct {
	podRef
	Container string `json:"container"`
}

type deviceJSON struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	Permissions   string `json:"permissions"`
}

type mountJSON struct {
	Name          string `json:"name,omitempty"`
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	ReadOnly      bool   `json:"read_only"`
}

// POST /devices/allocate {"namespace","name","container"}: admits the pod through the
// topology manager, whose Admit (policy "none") calls the device manager's Allocate for
// every init and app container in order — this is the kubelet's pod admission
// (GetAllocateResourcesPodAdmitHandler, with the "add" operation of a new pod). Re-admitting an admitted pod reuses its devices.
// Then GetDeviceRunContainerOptions for the requested container (as GetResources before
// container creation, which also calls PreStartContainer if the plugin asks for it).
func (p *peer) handleDevicesAllocate(w http.ResponseWriter, r *http.Request) {
	var req allocateRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Container == "" {
		writeError(w, http.StatusBadRequest, fmt.Errorf("container is required"))
		return
	}
	pod, status, err := p.fetchPod(r.Context(), req.podRef)
	if err != nil {
		writeError(w, status, err)
		return
	}
	var container *v1.Container
	for _, c := range allContainers(pod) {
		if c.Name == req.Container {
			container = c
		}
	}
	if container == nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("pod %s/%s has no container %q", pod.Namespace, pod.Name, req.Container))
		return
	}

	p.devMu.Lock()
	defer p.devMu.Unlock()
	var opts *devicemanager.DeviceRunContainerOptions
	admitted := false
	var admitSeconds float64
	err = p.withManagers(func(m *managers) error {
		started := time.Now()
		p.pods.mark(pod, nil, ptrTo(true)) // the pod being admitted counts as active
		// Admitted as the kubelet admits a new pod: the device manager allocates only for
		// an "add" (it skips resizes), and without it the allocation would happen later, in
		// GetDeviceRunContainerOptions' re-allocation, outside the admission.
		attrs := &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation}
		result := m.topology.Admit(p.ctx, attrs)
		if !result.Admit {
			return fmt.Errorf("pod admission failed: %s: %s", result.Reason, result.Message)
		}
		admitted = true
		admitSeconds = time.Since(started).Seconds()
		var err error
		opts, err = m.devices.GetDeviceRunContainerOptions(r.Context(), pod, container)
		return err
	})
	if !admitted {
		p.pods.mark(pod, nil, ptrTo(false)) // a rejected pod does not run
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}

	resp := struct {
		Devices     []deviceJSON      `json:"devices"`
		Envs        map[string]string `json:"envs"`
		Mounts      []mountJSON       `json:"mounts"`
		Annotations map[string]string `json:"annotations"`
		CDIDevices  []string          `json:"cdi_devices"`
		// How long the admission (the device manager's Allocate, plugin calls included) took.
		AdmitSeconds float64 `json:"admit_seconds"`
	}{[]deviceJSON{}, map[string]string{}, []mountJSON{}, map[string]string{}, []string{}, admitSeconds}
	if opts != nil {
		for _, d := range opts.Devices {
			resp.Devices = append(resp.Devices, deviceJSON{d.PathOnHost, d.PathInContainer, d.Permissions})
		}
		for _, e := range opts.Envs {
			resp.Envs[e.Name] = e.Value
		}
		for _, m := range opts.Mounts {
			resp.Mounts = append(resp.Mounts, mountJSON{m.Name, m.HostPath, m.ContainerPath, m.ReadOnly})
		}
		for _, a := range opts.Annotations {
			resp.Annotations[a.Name] = a.Value
		}
		for _, c := range opts.CDIDevices {
			resp.CDIDevices = append(resp.CDIDevices, c.Name)
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// POST /devices/release {"namespace","name"}: the pod stopped running (as far as device
// plugins are concerned): it leaves the active pods and UpdateAllocatedDevices frees its
// devices, as the kubelet does for terminated pods.
func (p *peer) handleDevicesRelease(w http.ResponseWriter, r *http.Request) {
	var req podRef
	if !decode(w, r, &req) {
		return
	}
	p.devMu.Lock()
	defer p.devMu.Unlock()
	released := 0
	for _, pod := range p.pods.active() {
		if pod.Namespace == req.Namespace && pod.Name == req.Name {
			p.pods.mark(pod, nil, ptrTo(false))
			released++
		}
	}
	if err := p.withManagers(func(m *managers) error { m.devices.UpdateAllocatedDevices(klog.FromContext(p.ctx)); return nil }); err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"released": released})
}

// GET /devices/allocatable: ManagerImpl.GetAllocatableDevices (what the pod-resources API's
// GetAllocatableResources reports): the ids of each resource's healthy devices, sorted.
func (p *peer) handleDevicesAllocatable(w http.ResponseWriter, r *http.Request) {
	out := map[string][]string{}
	err := p.withManagers(func(m *managers) error {
		for resource, byID := range m.devices.GetAllocatableDevices(klog.FromContext(p.ctx)) {
			ids := []string{}
			for id := range byID {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			out[resource] = ids
		}
		return nil
	})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"allocatable": out})
}

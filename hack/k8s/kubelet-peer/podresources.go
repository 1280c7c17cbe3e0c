package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// servePodResources serves the kubelet's own pod-resources v1 server
// (podresources.NewV1PodResourcesServer, as server.ListenAndServePodResources wires it) on
// socket, with the pods this node runs and the device manager as its providers. It lives
// across /restart, as a kubelet's does not need to: the providers always go through the
// current managers.
func (p *peer) servePodResources(ctx context.Context, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		return err
	}
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("pod-resources socket: %w", err)
	}
	providers := podresources.PodResourcesProviders{
		Pods:             podsProvider{p},
		Devices:          devicesProvider{p},
		Cpus:             noCPUs{},
		Memory:           noMemory{},
		DynamicResources: noDynamicResources{},
	}
	server := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	go func() {
		<-ctx.Done()
		server.Stop()
	}()
	go func() {
		if err := server.Serve(l); err != nil {
			klog.ErrorS(err, "pod-resources server stopped")
		}
	}()
	return nil
}

// podsProvider: the pods this node runs (the kubelet's pod manager).
type podsProvider struct{ p *peer }

func (pp podsProvider) GetActivePods() []*v1.Pod { return pp.p.pods.active() }
func (pp podsProvider) GetPods() []*v1.Pod       { return pp.p.pods.active() }
func (pp podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range pp.p.pods.active() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

// devicesProvider: the device manager, converted as containerManagerImpl.GetDevices does.
type devicesProvider struct{ p *peer }

func (dp devicesProvider) UpdateAllocatedDevices(logger klog.Logger) {
	_ = dp.p.withManagers(func(m *managers) error { m.devices.UpdateAllocatedDevices(logger); return nil })
}

func (dp devicesProvider) GetDevices(podUID, containerName string) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	_ = dp.p.withManagers(func(m *managers) error {
		out = toContainerDevices(m.devices.GetDevices(podUID, containerName))
		return nil
	})
	return out
}

func (dp devicesProvider) GetAllocatableDevices(logger klog.Logger) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	_ = dp.p.withManagers(func(m *managers) error {
		out = toContainerDevices(m.devices.GetAllocatableDevices(logger))
		return nil
	})
	return out
}

// toContainerDevices is cm.containerDevicesFromResourceDeviceInstances (unexported there)
// for plugins that report no topology, which is what the peer's plugins do.
func toContainerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	for resource, byID := range devs {
		for id := range byID {
			out = append(out, &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
		}
	}
	return out
}

type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesv1.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesv1.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesv1.ContainerMemory { return nil }

type noDynamicResources struct{}

func (noDynamicResources) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesv1.DynamicResource {
	return nil
}

// Command go-dra-driver is the Go peer of dra-plugin's side-by-side benchmark
// (dra-plugin/benches/versus_go.rs): a DRA kubelet plugin built the way Go drivers are built
// (dra-example-driver, NVIDIA's, Intel's), on upstream's
// k8s.io/dynamic-resource-allocation/kubeletplugin helper, doing per claim what the Rust
// example driver does:
//
//   - the helper reads the claim (and checks its UID) before PrepareResourceClaims;
//   - a claim already prepared is answered from the checkpoint (same CDI ids);
//   - otherwise one CDI spec per claim (GADGET_<DEVICE>=<device> per device), written to a
//     temporary file and renamed into place, as the Go CDI library writes specs;
//   - the prepared claims are stored in a checkpoint file (JSON, fsynced, renamed into
//     place, the directory fsynced, as dra-plugin stores) before the kubelet hears of them:
//     once per call, as dra-plugin stores (--checkpoint-per=call, the default), or after
//     each claim, as dra-example-driver does (--checkpoint-per=claim);
//   - unprepare removes the spec, fsyncs its directory (as dra-plugin does), and stores the
//     checkpoint again, as often.
//
// Its devices (dev-0 ... dev-<n-1>, each with an "index" attribute) are published with the
// helper's PublishResources, as the node's pool.
//
// On start it prints exactly one line "READY" on stdout; logs go to stderr. SIGTERM/SIGINT
// stop it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const cdiKind = "example.com/gadget"

type options struct {
	kubeconfig  string
	driverName  string
	nodeName    string
	registryDir string
	pluginDir   string
	cdiDir      string
	checkpoint  string
	perClaim    bool
	devices     int
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (required)")
	flag.StringVar(&o.driverName, "driver-name", "", "DRA driver name (required)")
	flag.StringVar(&o.nodeName, "node-name", "", "node name (required)")
	flag.StringVar(&o.registryDir, "registry-dir", "", "kubelet plugin registry directory (required)")
	flag.StringVar(&o.pluginDir, "plugin-dir", "", "this driver's socket directory (required)")
	flag.StringVar(&o.cdiDir, "cdi-dir", "", "where CDI specs are written (required)")
	flag.StringVar(&o.checkpoint, "checkpoint", "", "the checkpoint file (required)")
	flag.IntVar(&o.devices, "devices", 100, "how many devices the node publishes")
	per := flag.String("checkpoint-per", "call", "when the checkpoint is stored: once per call (\"call\") or after each claim (\"claim\")")
	klog.InitFlags(nil)
	flag.Parse()
	switch *per {
	case "call", "claim":
		o.perClaim = *per == "claim"
	default:
		fmt.Fprintf(os.Stderr, "--checkpoint-per must be \"call\" or \"claim\", not %q\n", *per)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(o options) error {
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	// client-go's default (5 per second, bursts of 10) would measure its rate limiter, not
	// the helper: every prepare reads its claims.
	config.QPS, config.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	for _, dir := range []string{o.registryDir, o.pluginDir, o.cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	d := &driver{name: o.driverName, cdiDir: o.cdiDir, checkpoint: o.checkpoint, perClaim: o.perClaim, prepared: map[types.UID]preparedClaim{}}
	if err := d.load(); err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.DriverName(o.driverName),
		kubeletplugin.NodeName(o.nodeName),
		kubeletplugin.RegistrarDirectoryPath(o.registryDir),
		kubeletplugin.PluginDataDirectoryPath(o.pluginDir),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()

	devices := make([]resourceapi.Device, o.devices)
	for i := range devices {
		devices[i] = resourceapi.Device{
			Name:       fmt.Sprintf("dev-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"index": {IntValue: ptr.To(int64(i))}},
		}
	}
	// The helper publishes the slices it is given: at most 128 devices each is the driver's
	// job (the API server refuses more).
	var slices []resourceslice.Slice
	for start := 0; start < len(devices); start += 128 {
		slices = append(slices, resourceslice.Slice{Devices: devices[start:min(start+128, len(devices))]})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{o.nodeName: {Slices: slices}},
	}); err != nil {
		return err
	}
	fmt.Println("READY")
	<-ctx.Done()
	return nil
}

// The checkpoint: every prepared claim with its devices and spec file.
type preparedClaim struct {
	Devices  []kubeletplugin.Device `json:"devices"`
	SpecFile string                 `json:"specFile"`
}

type driver struct {
	name       string
	cdiDir     string
	checkpoint string
	perClaim   bool
	mutex      sync.Mutex
	prepared   map[types.UID]preparedClaim
}

var _ kubeletplugin.DRAPlugin = &driver{}

func (d *driver) load() error {
	data, err := os.ReadFile(d.checkpoint)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(data, &d.prepared)
}

// store writes the checkpoint as the kubelet's checkpoint manager does: a temporary file,
// fsynced, renamed over the old one.
func (d *driver) store() error {
	data, err := json.Marshal(d.prepared)
	if err != nil {
		return err
	}
	return writeFile(d.checkpoint, data, true)
}

func writeFile(path string, data []byte, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a rename or removal in dir durable, as dra-plugin does after storing its
// checkpoint and after removing a claim's CDI spec.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mutex.Lock()
	defer d.mutex.Unlock()
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var added []types.UID
	for _, claim := range claims {
		devices, isNew, err := d.prepare(claim)
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
		if isNew {
			added = append(added, claim.UID)
		}
	}
	if d.perClaim || len(added) == 0 {
		return result, nil
	}
	// Once per call: the claims prepared by it are recorded together, or none is.
	if err := d.store(); err != nil {
		for _, uid := range added {
			os.Remove(d.prepared[uid].SpecFile)
			delete(d.prepared, uid)
			result[uid] = kubeletplugin.PrepareResult{Err: err}
		}
	}
	return result, nil
}

// prepare prepares one claim; isNew says it was not prepared before (and, stored per call,
// is not in the checkpoint yet).
func (d *driver) prepare(claim *resourceapi.ResourceClaim) (devices []kubeletplugin.Device, isNew bool, err error) {
	if prepared, ok := d.prepared[claim.UID]; ok {
		return prepared.Devices, false, nil
	}
	if claim.Status.Allocation == nil {
		return nil, false, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	type cdiDevice struct {
		Name           string `json:"name"`
		ContainerEdits struct {
			Env []string `json:"env"`
		} `json:"containerEdits"`
	}
	var cdiDevices []cdiDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		name := string(claim.UID) + "-" + r.Device
		var device cdiDevice
		device.Name = name
		device.ContainerEdits.Env = []string{fmt.Sprintf("GADGET_%s=%s", strings.ToUpper(r.Device), r.Device)}
		cdiDevices = append(cdiDevices, device)
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{cdiKind + "=" + name},
		})
	}
	if len(devices) == 0 {
		return nil, false, fmt.Errorf("claim %s/%s has no device of driver %s", claim.Namespace, claim.Name, d.name)
	}
	spec, err := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": cdiKind, "devices": cdiDevices})
	if err != nil {
		return nil, false, err
	}
	specFile := filepath.Join(d.cdiDir, "example.com-gadget-"+string(claim.UID)+".json")
	if err := writeFile(specFile, spec, false); err != nil {
		return nil, false, err
	}
	d.prepared[claim.UID] = preparedClaim{Devices: devices, SpecFile: specFile}
	if !d.perClaim {
		return devices, true, nil
	}
	if err := d.store(); err != nil {
		delete(d.prepared, claim.UID)
		os.Remove(specFile)
		return nil, false, err
	}
	return devices, false, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mutex.Lock()
	defer d.mutex.Unlock()
	result := make(map[types.UID]error, len(claims))
	var removed []types.UID
	for _, claim := range claims {
		prepared, ok := d.prepared[claim.UID]
		if !ok {
			result[claim.UID] = nil
			continue
		}
		if err := os.Remove(prepared.SpecFile); err != nil && !os.IsNotExist(err) {
			result[claim.UID] = err
			continue
		}
		// The removal made durable before the checkpoint forgets the claim.
		if err := syncDir(d.cdiDir); err != nil {
			result[claim.UID] = err
			continue
		}
		delete(d.prepared, claim.UID)
		if d.perClaim {
			result[claim.UID] = d.store()
			continue
		}
		removed = append(removed, claim.UID)
	}
	if len(removed) > 0 {
		// A failed store leaves the claims in the checkpoint: the kubelet asks again, and
		// their spec files are already gone.
		err := d.store()
		for _, uid := range removed {
			result[uid] = err
		}
	}
	return result, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// The benchmark driver reports no device health (the Rust drivers it is compared with do,
// but the benchmark measures prepare, not health streams).
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

package main

import (
	"net/http"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type injectRequest struct {
	Devices []string `json:"devices"`
}

// POST /cdi/inject {"devices": ["vendor/class=name", ...]}: what a CDI-enabled runtime
// (containerd, CRI-O) does with the ids the kubelet passes: load the spec files from
// --cdi-dir with the reference library and inject the devices into an (empty) OCI spec.
//
// 200: {"env": [...], "mounts": [...], "devices": [...], "hooks": {...}|null,
//
//	"spec": <whole OCI spec>, "spec_errors": {"<file>": ["..."]}}
//
// 400: {"error": "unresolvable CDI devices ...", "unresolved": [...], "spec_errors": {...}}
// 422: {"error": "failed to inject devices: ...", "spec_errors": {...}} (e.g. a device
// node whose host path does not exist and whose type/major/minor are not given).
// spec_errors lists spec files the library rejected (their devices are unresolvable).
func (p *peer) handleCDIInject(w http.ResponseWriter, r *http.Request) {
	var req injectRequest
	if !decode(w, r, &req) {
		return
	}
	// A fresh cache per request: the spec files are re-read every time, no watcher.
	c, err := cdi.NewCache(cdi.WithSpecDirs(p.opts.cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	specErrors := map[string][]string{}
	for file, errs := range c.GetErrors() {
		for _, e := range errs {
			specErrors[file] = append(specErrors[file], e.Error())
		}
	}

	spec := &oci.Spec{}
	unresolved, err := c.InjectDevices(spec, req.Devices...)
	if err != nil {
		status, body := http.StatusUnprocessableEntity, map[string]any{"error": err.Error(), "spec_errors": specErrors}
		if len(unresolved) > 0 {
			sort.Strings(unresolved)
			status, body["unresolved"] = http.StatusBadRequest, unresolved
		}
		writeJSON(w, status, body)
		return
	}

	env := []string{}
	if spec.Process != nil && spec.Process.Env != nil {
		env = spec.Process.Env
	}
	mounts := spec.Mounts
	if mounts == nil {
		mounts = []oci.Mount{}
	}
	devices := []oci.LinuxDevice{}
	if spec.Linux != nil && spec.Linux.Devices != nil {
		devices = spec.Linux.Devices
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"env": env, "mounts": mounts, "devices": devices, "hooks": spec.Hooks,
		"spec": spec, "spec_errors": specErrors,
	})
}

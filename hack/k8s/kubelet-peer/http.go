package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// routes: the HTTP API. JSON in and out; errors are 4xx/5xx with {"error": "..."}.
// A bad request fails only that request (net/http also recovers handler panics).
//
//	GET  /healthz
//	GET  /dra/drivers          -> {"drivers": [...], "endpoints": {"driver": ["/abs/dra.sock"]}}
//	POST /dra/prepare          {"namespace","name"} -> {"containers": {"c": ["vendor/class=dev", ...]}}
//	POST /dra/unprepare        {"namespace","name"} -> {}
//	GET  /dra/health           -> {"drivers": {"driver": [{"pool","device","health","message","last_updated","health_check_timeout_seconds"}]}}
//	POST /dra/health/pod       {"namespace","name"} -> {"containers": {"c": [v1.ResourceStatus]}}
//	GET  /devices/capacity     -> {"capacity": {"res": n}, "allocatable": {"res": n}, "deleted": ["res"]}
//	GET  /devices/allocatable  -> {"allocatable": {"res": ["healthy device id", ...]}}
//	POST /devices/allocate     {"namespace","name","container"} -> {"devices","envs","mounts","annotations","cdi_devices","admit_seconds"}
//	POST /devices/release      {"namespace","name"} -> {"released": n}
//	POST /restart              -> {} once the new managers run
//	POST /cdi/inject           {"devices": [...]} -> {"env","mounts","devices","hooks","spec","spec_errors"}
func (p *peer) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	mux.HandleFunc("GET /dra/drivers", p.handleDRADrivers)
	mux.HandleFunc("POST /dra/prepare", p.handleDRAPrepare)
	mux.HandleFunc("POST /dra/unprepare", p.handleDRAUnprepare)
	mux.HandleFunc("GET /dra/health", p.handleDRAHealth)
	mux.HandleFunc("POST /dra/health/pod", p.handleDRAHealthPod)
	mux.HandleFunc("GET /devices/capacity", p.handleDevicesCapacity)
	mux.HandleFunc("GET /devices/allocatable", p.handleDevicesAllocatable)
	mux.HandleFunc("POST /devices/allocate", p.handleDevicesAllocate)
	mux.HandleFunc("POST /devices/release", p.handleDevicesRelease)
	mux.HandleFunc("POST /restart", p.handleRestart)
	mux.HandleFunc("POST /cdi/inject", p.handleCDIInject)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		klog.V(2).InfoS("HTTP request", "method", r.Method, "path", r.URL.Path)
		// Unknown paths and wrong methods get JSON errors too (ServeMux answers in text).
		if _, pattern := mux.Handler(r); pattern == "" {
			writeError(w, http.StatusNotFound, fmt.Errorf("no route for %s %s", r.Method, r.URL.Path))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// POST /restart: stop all managers and start new ones on the same directories.
func (p *peer) handleRestart(w http.ResponseWriter, r *http.Request) {
	if err := p.restart(); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

type podRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// decode reads a JSON request body into v; for a podRef-like v it checks that namespace
// and name are set. On failure it answers 400 and returns false.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err == nil {
		var ref *podRef
		switch t := v.(type) {
		case *podRef:
			ref = t
		case *allocateRequest:
			ref = &t.podRef
		}
		if ref != nil && (ref.Namespace == "" || ref.Name == "") {
			err = fmt.Errorf("namespace and name are required")
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("bad request: %w", err))
		return false
	}
	return true
}

// fetchPod gets the pod from the API server; the int is the HTTP status to answer on error.
func (p *peer) fetchPod(ctx context.Context, ref podRef) (*v1.Pod, int, error) {
	pod, err := p.client.CoreV1().Pods(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, http.StatusNotFound, fmt.Errorf("pod %s/%s not found", ref.Namespace, ref.Name)
	case err != nil:
		return nil, http.StatusBadGateway, fmt.Errorf("get pod %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return pod, http.StatusOK, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		klog.ErrorS(err, "Writing response")
	}
}

func writeError(w http.ResponseWriter, status int, err error) {
	klog.V(1).InfoS("Request failed", "status", status, "err", err)
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

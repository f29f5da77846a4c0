package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// prober checks component probes. The admin credentials are loaded lazily:
// they only matter for the API server probe.
type prober struct {
	pki *PKI
}

func (p *prober) check(ctx context.Context, probe Probe) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	switch probe.Kind {
	case "unix":
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", probe.Path)
		if err != nil {
			return err
		}
		return conn.Close()
	case "http":
		return httpGet(ctx, http.DefaultClient, probe.URL)
	case "https-insecure":
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed component serving certs on loopback
		return httpGet(ctx, client, probe.URL)
	case "https-client":
		tlsConfig, err := p.adminTLS()
		if err != nil {
			return err
		}
		return httpGet(ctx, &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}, probe.URL)
	case "node-ready":
		tlsConfig, err := p.adminTLS()
		if err != nil {
			return err
		}
		body, err := httpGetBody(ctx, &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}, probe.URL)
		if err != nil {
			return err
		}
		return nodeReadyJSON(body)
	default:
		return fmt.Errorf("unknown probe kind %q", probe.Kind)
	}
}

func (p *prober) adminTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(p.pki.ClientCert(AdminIdentity), p.pki.ClientKey(AdminIdentity))
	if err != nil {
		return nil, fmt.Errorf("load admin client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(p.pki.CACert())
	if err != nil {
		return nil, fmt.Errorf("read cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("cluster CA %s holds no certificate", p.pki.CACert())
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func httpGet(ctx context.Context, client *http.Client, url string) error {
	_, err := httpGetBody(ctx, client, url)
	return err
}

// httpGetBody GETs url and returns the body of a 200 answer (at most 1 MiB).
func httpGetBody(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.2048s", url, resp.Status, body)
	}
	return body, nil
}

// nodeReadyJSON says whether a Node object (JSON) has the condition Ready=True,
// and if not, why.
func nodeReadyJSON(body []byte) error {
	var node corev1.Node
	if err := json.Unmarshal(body, &node); err != nil {
		return fmt.Errorf("decode Node: %w", err)
	}
	if nodeReady(&node) {
		return nil
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return fmt.Errorf("node %s is not Ready: %s (%s)", node.Name, c.Reason, c.Message)
		}
	}
	return fmt.Errorf("node %s has no Ready condition yet", node.Name)
}

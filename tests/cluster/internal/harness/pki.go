package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is the cluster's certificate authority plus the files every component
// reads. All keys are ECDSA P-256: quick to generate and accepted everywhere,
// including as the service-account token signing key (ES256).
type PKI struct {
	Dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
}

// Identity is a client certificate subject: CN is the user, O the groups.
type Identity struct {
	File   string // base name of the .crt/.key pair
	User   string
	Groups []string
}

// Identities the cluster uses. Controller-manager and scheduler use the names
// the RBAC bootstrap policy grants; kubelets are system:node:<name> in
// system:nodes so the Node authorizer and NodeRestriction apply to them.
var (
	AdminIdentity             = Identity{File: "admin", User: "tessera-admin", Groups: []string{"system:masters"}}
	ControllerManagerIdentity = Identity{File: "kube-controller-manager", User: "system:kube-controller-manager"}
	SchedulerIdentity         = Identity{File: "kube-scheduler", User: "system:kube-scheduler"}
	APIServerKubeletClient    = Identity{File: "apiserver-kubelet-client", User: "kube-apiserver-kubelet-client", Groups: []string{"system:masters"}}
	// KubeProxyIdentity is bound to system:node-proxier by the RBAC bootstrap policy.
	KubeProxyIdentity = Identity{File: "kube-proxy", User: "system:kube-proxy"}
	// FrontProxyClient is the API server's certificate towards aggregated API
	// servers (an APIService backed by a Service, e.g. Kueue's visibility API).
	// They believe the user the API server names in its X-Remote-* headers only
	// from a client certificate signed by the requestheader CA (here the
	// cluster CA) whose CN is an allowed name (this one). Without it the
	// aggregator's availability check is refused, the APIService stays
	// unavailable, and namespace deletion waits for its discovery forever.
	FrontProxyClient = Identity{File: "front-proxy-client", User: "front-proxy-client"}
)

// NodeIdentity is the credential of the kubelet on node.
func NodeIdentity(node string) Identity {
	return Identity{File: "node-" + node, User: "system:node:" + node, Groups: []string{"system:nodes"}}
}

func (p *PKI) CACert() string               { return filepath.Join(p.Dir, "ca.crt") }
func (p *PKI) CAKey() string                { return filepath.Join(p.Dir, "ca.key") }
func (p *PKI) ServingCert() string          { return filepath.Join(p.Dir, "apiserver.crt") }
func (p *PKI) ServingKey() string           { return filepath.Join(p.Dir, "apiserver.key") }
func (p *PKI) ServiceAccountKey() string    { return filepath.Join(p.Dir, "sa.key") }
func (p *PKI) ServiceAccountPubKey() string { return filepath.Join(p.Dir, "sa.pub") }
func (p *PKI) ClientCert(id Identity) string {
	return filepath.Join(p.Dir, id.File+".crt")
}
func (p *PKI) ClientKey(id Identity) string {
	return filepath.Join(p.Dir, id.File+".key")
}

// NewPKI creates a fresh CA, the API server's serving certificate and the
// service-account key pair in dir. The serving certificate names loopback,
// the `kubernetes` service's names and serviceIP (what pods dial), and
// bridgeIP (where the API server listens with the containerd runtime).
func NewPKI(dir string, serviceIP, bridgeIP net.IP) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create PKI directory %s: %w", dir, err)
	}
	p := &PKI{Dir: dir}
	caKey, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tessera-test-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("self-sign the cluster CA: %w", err)
	}
	if p.caCert, err = x509.ParseCertificate(caDER); err != nil {
		return nil, fmt.Errorf("parse the cluster CA: %w", err)
	}
	p.caKey = caKey
	if err := writeCert(p.CACert(), caDER); err != nil {
		return nil, err
	}
	if err := writeKey(p.CAKey(), caKey); err != nil {
		return nil, err
	}

	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP, bridgeIP},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := p.issue(serving, p.ServingCert(), p.ServingKey()); err != nil {
		return nil, fmt.Errorf("issue the API server serving certificate: %w", err)
	}

	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	if err := writeKey(p.ServiceAccountKey(), saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("encode the service-account public key: %w", err)
	}
	if err := writePEM(p.ServiceAccountPubKey(), "PUBLIC KEY", pubDER, 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

// IssueClient writes a client certificate and key for id.
func (p *PKI) IssueClient(id Identity) error {
	template := &x509.Certificate{
		Subject:     pkix.Name{CommonName: id.User, Organization: id.Groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := p.issue(template, p.ClientCert(id), p.ClientKey(id)); err != nil {
		return fmt.Errorf("issue client certificate for %s: %w", id.User, err)
	}
	return nil
}

func (p *PKI) issue(template *x509.Certificate, certPath, keyPath string) error {
	key, err := newKey()
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return fmt.Errorf("draw a serial number: %w", err)
	}
	now := time.Now()
	template.SerialNumber = serial
	template.NotBefore = now.Add(-time.Hour)
	template.NotAfter = now.Add(365 * 24 * time.Hour)
	template.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, template, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return fmt.Errorf("sign %s: %w", certPath, err)
	}
	if err := writeCert(certPath, der); err != nil {
		return err
	}
	return writeKey(keyPath, key)
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate an ECDSA P-256 key: %w", err)
	}
	return key, nil
}

func writeCert(path string, der []byte) error {
	return writePEM(path, "CERTIFICATE", der, 0o644)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode private key for %s: %w", path, err)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, blockType string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

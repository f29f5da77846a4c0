package harness

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfig writes a kubeconfig that authenticates as id with its
// client certificate (file references, so the files can be inspected).
func writeKubeconfig(path, server string, pki *PKI, id Identity) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tessera"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: pki.CACert()}
	cfg.AuthInfos[id.User] = &clientcmdapi.AuthInfo{
		ClientCertificate: pki.ClientCert(id),
		ClientKey:         pki.ClientKey(id),
	}
	cfg.Contexts["tessera"] = &clientcmdapi.Context{Cluster: "tessera", AuthInfo: id.User}
	cfg.CurrentContext = "tessera"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s for %s: %w", path, id.User, err)
	}
	return nil
}

package contextresource

type Storage struct {
	Backend      string `json:"backend"`
	Size         string `json:"size"`
	AccessMode   string `json:"accessMode"`
	StorageClass string `json:"storageClass,omitempty"`
}

type CreateRequest struct {
	Name      string  `json:"name"`
	Namespace string  `json:"namespace"`
	Type      string  `json:"type"`
	Storage   Storage `json:"storage"`
}

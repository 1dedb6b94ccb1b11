package pool

type Workspace struct {
	Size         string `json:"size"`
	AccessMode   string `json:"accessMode"`
	StorageClass string `json:"storageClass,omitempty"`
	ClaimName    string `json:"claimName,omitempty"`
	ReadOnly     *bool  `json:"readOnly,omitempty"`
}

type CreateRequest struct {
	Name        string    `json:"name"`
	Replicas    int       `json:"replicas"`
	WarmPoolRef string    `json:"warmPoolRef,omitempty"`
	Workspace   Workspace `json:"workspace"`
}

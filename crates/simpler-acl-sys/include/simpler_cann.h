/*
 * simpler_cann.h: the CANN declarations simpler uses, written by the simpler project.
 *
 * Pinned release: CANN 8.2.RC1 (struct layouts of that release; `rtTaskCfgInfo_t` is the
 * 16-byte form and `rtHostInputInfo_t` has 32-bit offsets).
 *
 * This is an excerpt: every name and definition below matches the installed CANN headers of the
 * pinned release, and only what `symbols.toml` lists is declared. `cargo xtask bindgen`
 * generates `src/generated/` from this file; `cargo xtask bindgen --check` keeps the list, this
 * header, the generated bindings and the lazy wrappers in agreement.
 *
 * Layout rule: one declaration per statement, each function on lines of its own ending in `;`,
 * so that the list check can read the function names without a C parser.
 */
#ifndef SIMPLER_CANN_H
#define SIMPLER_CANN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Scalar and handle types ------------------------------------------------------------ */

typedef int aclError;
typedef int32_t rtError_t;
typedef int32_t HcclResult;

typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void *rtStream_t;
typedef void *rtBinHandle;
typedef void *rtFuncHandle;
typedef void *HcclComm;

/* ---- ACL constants and enums ------------------------------------------------------------ */

static const int ACL_SUCCESS = 0;
static const int ACL_ERROR_REPEAT_INITIALIZE = 100002;
static const int ACL_ERROR_RT_DEVICE_TASK_ABORT = 107022;
static const int ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;
static const int ACL_ERROR_RT_INTERNAL_ERROR = 507000;
static const int ACL_ERROR_RT_AICORE_TIMEOUT = 507014;
static const int ACL_ERROR_RT_AICORE_EXCEPTION = 507015;
static const int ACL_ERROR_RT_AICPU_TIMEOUT = 507017;
static const int ACL_ERROR_RT_AICPU_EXCEPTION = 507018;
static const int ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046;
static const int ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047;
static const int ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899;

/* aclrtSetStreamFailureMode: whether a stream goes on after a failed task (the default) or
   stops, failing everything behind it. */
static const uint64_t ACL_CONTINUE_ON_FAILURE = 0;
static const uint64_t ACL_STOP_ON_FAILURE = 1;

typedef enum aclrtMemMallocPolicy {
    ACL_MEM_MALLOC_HUGE_FIRST = 0,
    ACL_MEM_MALLOC_HUGE_ONLY = 1,
    ACL_MEM_MALLOC_NORMAL_ONLY = 2,
} aclrtMemMallocPolicy;

typedef enum aclrtMemcpyKind {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
} aclrtMemcpyKind;

typedef enum aclrtDevResLimitType {
    ACL_RT_DEV_RES_CUBE_CORE = 0,
    ACL_RT_DEV_RES_VECTOR_CORE = 1,
} aclrtDevResLimitType;

typedef enum aclrtEventRecordedStatus {
    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
    ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
} aclrtEventRecordedStatus;

/* ---- RTS constants, enums and structs --------------------------------------------------- */

static const int32_t RT_ERROR_NONE = 0;

typedef uint32_t rtMemType_t;
#define RT_MEMORY_DEFAULT (0x0U)
#define RT_MEMORY_HBM (0x2U)

#define RT_DEV_BINARY_MAGIC_ELF (0x43554245U)

typedef enum tagRtMemcpyKind {
    RT_MEMCPY_HOST_TO_HOST = 0,
    RT_MEMCPY_HOST_TO_DEVICE = 1,
    RT_MEMCPY_DEVICE_TO_HOST = 2,
    RT_MEMCPY_DEVICE_TO_DEVICE = 3,
} rtMemcpyKind_t;

typedef enum schemModeType {
    RT_SCHEM_MODE_NORMAL = 0,
    RT_SCHEM_MODE_BATCH = 1,
    RT_SCHEM_MODE_SYNC = 2,
    RT_SCHEM_MODE_END = 3,
} rtschemModeType_t;

typedef enum rtKernelType {
    KERNEL_TYPE_CCE = 0,
    KERNEL_TYPE_FWK = 1,
    KERNEL_TYPE_AICPU = 2,
    KERNEL_TYPE_AICPU_CUSTOM = 4,
    KERNEL_TYPE_AICPU_KFC = 5,
    KERNEL_TYPE_CUSTOM_KFC = 6,
} rtKernelType_t;

typedef enum {
    RT_LOAD_BINARY_OPT_LAZY_LOAD = 1,
    RT_LOAD_BINARY_OPT_MAGIC = 2,
    RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE = 3,
} rtLoadBinaryOption;

typedef enum {
    RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE = 1,
    RT_LAUNCH_KERNEL_ATTR_LOCAL_MEM_SIZE = 2,
    RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE = 3,
    RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET = 4,
    RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH = 5,
    RT_LAUNCH_KERNEL_ATTR_DATA_DUMP = 6,
    RT_LAUNCH_KERNEL_ATTR_TIMEOUT = 7,
} rtLaunchKernelAttrId;

typedef enum {
    RT_ENGINE_TYPE_AIC = 0,
    RT_ENGINE_TYPE_AIV = 1,
} rtEngineType;

typedef struct tagRtDevBinary {
    uint32_t magic;
    uint32_t version;
    const void *data;
    uint64_t length;
} rtDevBinary_t;

typedef struct tagRtHostInputInfo {
    uint32_t addrOffset;
    uint32_t dataOffset;
} rtHostInputInfo_t;

typedef struct tagRtArgsEx {
    void *args;
    rtHostInputInfo_t *hostInputInfoPtr;
    uint32_t argsSize;
    uint32_t tilingAddrOffset;
    uint32_t tilingDataOffset;
    uint16_t hostInputInfoNum;
    uint8_t hasTiling;
    uint8_t isNoNeedH2DCopy;
    uint8_t reserved[4];
} rtArgsEx_t;

typedef struct tagRtTaskCfgInfo {
    uint8_t qos;
    uint8_t partId;
    uint8_t schemMode;
    bool d2dCrossFlag;
    uint32_t blockDimOffset;
    uint8_t dumpflag;
    uint8_t neverTimeout;
    uint8_t rev[2];
    uint32_t localMemorySize;
} rtTaskCfgInfo_t;

/* Only ever passed as a null pointer, so its layout is left out. */
typedef struct tagRtSmCtrl rtSmDesc_t;

typedef struct tagRtAicpuArgsEx {
    void *args;
    rtHostInputInfo_t *hostInputInfoPtr;
    rtHostInputInfo_t *kernelOffsetInfoPtr;
    uint32_t argsSize;
    uint16_t hostInputInfoNum;
    uint16_t kernelOffsetInfoNum;
    uint32_t soNameAddrOffset;
    uint32_t kernelNameAddrOffset;
    bool isNoNeedH2DCopy;
    uint16_t timeout;
    uint8_t reserved;
} rtAicpuArgsEx_t;

typedef struct {
    rtAicpuArgsEx_t baseArgs;
    size_t cpuParamHeadOffset;
    uint32_t rsv[4];
} rtCpuKernelArgs_t;

typedef union {
    uint8_t schemMode;
    uint32_t localMemorySize;
    rtEngineType engineType;
    uint32_t blockDimOffset;
    uint8_t isBlockTaskPrefetch;
    uint8_t isDataDump;
    uint16_t timeout;
    uint32_t rsv[4];
} rtLaunchKernelAttrVal_t;

typedef struct {
    rtLaunchKernelAttrId id;
    rtLaunchKernelAttrVal_t value;
} rtLaunchKernelAttr_t;

typedef struct {
    rtLaunchKernelAttr_t *attrs;
    size_t numAttrs;
} rtKernelLaunchCfg_t;

typedef union {
    uint32_t isLazyLoad;
    uint32_t magic;
    int32_t cpuKernelMode;
    uint32_t rsv[4];
} rtLoadBinaryOptionValue_t;

typedef struct {
    rtLoadBinaryOption optionId;
    rtLoadBinaryOptionValue_t value;
} rtLoadBinaryOption_t;

typedef struct {
    rtLoadBinaryOption_t *options;
    size_t numOpt;
} rtLoadBinaryConfig_t;

/* ---- Driver (HAL) constants and structs ------------------------------------------------- */

enum drvRegisterTpye {
    HOST_MEM_MAP_DEV = 0,
    HOST_SVM_MAP_DEV = 1,
    DEV_SVM_MAP_HOST = 2,
};

enum ctrlType {
    CTRL_TYPE_ADDR_MAP = 0,
    CTRL_TYPE_ADDR_UNMAP = 1,
};

enum addrMapType {
    ADDR_MAP_TYPE_L2_BUFF = 0,
    ADDR_MAP_TYPE_REG_C2C_CTRL = 1,
    ADDR_MAP_TYPE_REG_AIC_CTRL = 2,
    ADDR_MAP_TYPE_REG_AIC_PMU_CTRL = 3,
};

typedef enum {
    MODULE_TYPE_SYSTEM = 0,
    MODULE_TYPE_AICPU = 1,
    MODULE_TYPE_CCPU = 2,
    MODULE_TYPE_DCPU = 3,
    MODULE_TYPE_AICORE = 4,
} DEV_MODULE_TYPE;

typedef enum {
    INFO_TYPE_ENV = 0,
    INFO_TYPE_VERSION = 1,
    INFO_TYPE_MASTERID = 2,
    INFO_TYPE_CORE_NUM = 3,
    INFO_TYPE_OCCUPY = 8,
} DEV_INFO_TYPE;

struct AddrMapInPara {
    unsigned int addr_type;
    unsigned int devid;
};

struct AddrMapOutPara {
    unsigned long long ptr;
    unsigned long long len;
};

/* ---- HCCL types ------------------------------------------------------------------------- */

#define HCCL_ROOT_INFO_BYTES 4108

typedef struct HcclRootInfoDef {
    char internal[HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

/* ---- libascendcl.so --------------------------------------------------------------------- */

aclError aclInit(const char *configPath);
aclError aclFinalize(void);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtResetDeviceForce(int32_t deviceId);
aclError aclrtGetDevice(int32_t *deviceId);
aclError aclrtGetDeviceCount(uint32_t *count);
const char *aclrtGetSocName(void);
aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion);
aclError aclrtSetOpExecuteTimeOutV2(uint64_t timeout, uint64_t *actualTimeout);
aclError aclrtGetStreamResLimit(aclrtStream stream, aclrtDevResLimitType type, uint32_t *value);
aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);
aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode);
aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout);
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                     aclrtMemcpyKind kind);
aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count);
const char *aclGetRecentErrMsg(void);
aclError aclrtCreateEvent(aclrtEvent *event);
aclError aclrtDestroyEvent(aclrtEvent event);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status);
aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);

/* ---- libruntime.so ---------------------------------------------------------------------- */

rtError_t rtSetDevice(int32_t devId);
rtError_t rtDeviceReset(int32_t devId);
rtError_t rtStreamCreate(rtStream_t *stm, int32_t priority);
rtError_t rtStreamDestroy(rtStream_t stm);
rtError_t rtMalloc(void **devPtr, uint64_t size, rtMemType_t type, const uint16_t moduleId);
rtError_t rtFree(void *devPtr);
rtError_t rtMemcpy(void *dst, uint64_t destMax, const void *src, uint64_t cnt,
                   rtMemcpyKind_t kind);
rtError_t rtRegisterAllKernel(const rtDevBinary_t *bin, void **hdl);
rtError_t rtDevBinaryUnRegister(void *hdl);
rtError_t rtKernelLaunchWithHandleV2(void *hdl, const uint64_t tilingKey, uint32_t blockDim,
                                     rtArgsEx_t *argsInfo, rtSmDesc_t *smDesc, rtStream_t stm,
                                     const rtTaskCfgInfo_t *cfgInfo);
rtError_t rtGetC2cCtrlAddr(uint64_t *addr, uint32_t *len);
rtError_t rtAicpuKernelLaunchExWithArgs(const uint32_t kernelType, const char *const opName,
                                        const uint32_t blockDim, const rtAicpuArgsEx_t *argsInfo,
                                        rtSmDesc_t *const smDesc, const rtStream_t stm,
                                        const uint32_t flags);
rtError_t rtsBinaryLoadFromFile(const char *const binPath, const rtLoadBinaryConfig_t *const optionalCfg,
                                rtBinHandle *handle);
rtError_t rtsFuncGetByName(const rtBinHandle binHandle, const char *kernelName,
                           rtFuncHandle *funcHandle);
rtError_t rtsLaunchCpuKernel(const rtFuncHandle funcHandle, uint32_t blockDim, rtStream_t stm,
                             const rtKernelLaunchCfg_t *cfg, rtCpuKernelArgs_t *argsInfo);
rtError_t rtsBinaryUnload(const rtBinHandle binHandle);

/* ---- libascend_hal.so ------------------------------------------------------------------- */

int halHostRegister(void *devPtr, size_t size, unsigned int flag, int devid, void **hostPtr);
int halHostUnregister(void *devPtr, int devid);
int halGetDeviceInfo(uint32_t devId, int32_t moduleType, int32_t infoType, int64_t *value);
int halGetDeviceInfoByBuff(uint32_t devId, int32_t moduleType, int32_t infoType, void *buf,
                           int32_t *size);
int halMemCtl(int type, void *paramValue, size_t paramValueSize, void *outValue,
              size_t *outSizeRet);

/* ---- libunified_dlog.so / libascendalog.so ---------------------------------------------- */

int dlog_setlevel(int moduleId, int level, int enableEvent);

/* ---- libhcomm.so / libhccl.so ----------------------------------------------------------- */

HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                HcclComm *comm);
HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);
HcclResult HcclCommDestroy(HcclComm comm);

#ifdef __cplusplus
}
#endif

#endif /* SIMPLER_CANN_H */
